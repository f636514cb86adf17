"""A record of which training instances each step saw (``run.trace_batches: true``).

Every rank appends, per step, the global instance indices of its share of the batch and a hash
of their tokens to ``SAVE_FOLDER/batches/rank{R}.jsonl``. The union over ranks of a step's
indices is the global batch, whatever the number of processes: that is how a resume with a
different world size is checked to continue the same data order, and how an order can be
compared with another trainer's. A resumed run appends; for a step seen twice the later wins.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Tuple

from olmo_core.distributed.utils import get_rank
from olmo_core.train.callbacks import Callback

__all__ = ["BatchTraceCallback", "read_batch_trace"]

TRACE_DIR = "batches"


@dataclass
class BatchTraceCallback(Callback):
    def pre_step(self, batch: Dict[str, Any]):
        indices = [int(i) for i in batch["index"].tolist()]
        tokens = batch["input_ids"].cpu().numpy()
        record = {
            "step": self.step,  # the trainer increments global_step before pre_step
            "indices": indices,
            "tokens": {
                str(i): hashlib.sha1(row.tobytes()).hexdigest()[:16]
                for i, row in zip(indices, tokens)
            },
        }
        path = Path(self.trainer.save_folder) / TRACE_DIR / f"rank{get_rank()}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(json.dumps(record) + "\n")


def read_batch_trace(run_dir: str | Path) -> Dict[int, List[Tuple[int, str]]]:
    """{step: sorted [(instance index, token hash)]} over all ranks' files of a run."""
    merged: Dict[int, Dict[str, str]] = defaultdict(dict)
    for path in sorted((Path(run_dir) / TRACE_DIR).glob("rank*.jsonl")):
        steps: Dict[int, Dict[str, str]] = {}
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                steps[int(record["step"])] = record["tokens"]  # a rank's later record wins
        for step, tokens in steps.items():
            merged[step].update(tokens)
    return {
        step: sorted((int(i), h) for i, h in tokens.items())
        for step, tokens in sorted(merged.items())
    }
