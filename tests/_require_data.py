"""Under torchrun with 2 ranks: olmo_patches.launch.shared_fs.require_data on rank-dependent paths
(test helper). For each case NAME given as NAME=RANK0PATHS;RANK1PATHS (paths comma-separated), rank
0 prints "NAME: ok" or "NAME: LINE"."""

import os
import sys

from olmo_core.distributed.utils import init_distributed

from olmo_patches.config import ConfigError
from olmo_patches.launch.shared_fs import require_data

init_distributed(backend="gloo")
rank = int(os.environ["RANK"])
for case in sys.argv[1:]:
    name, paths = case.split("=", 1)
    mine = [p for p in paths.split(";")[rank].split(",") if p]
    try:
        require_data(mine)
        line = "ok"
    except ConfigError as e:
        line = str(e)
    if rank == 0:
        print(f"{name}: {line}", flush=True)
