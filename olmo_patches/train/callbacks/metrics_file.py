"""``SAVE/metrics.jsonl``: every metric the Trainer logs, one JSON line per step, on rank 0,
whatever else logs (console, wandb); the demo summary, the tables and the figures read it.

What OLMo-core lacks: its MetricSaverCallback keeps the latest value of each metric only
(olmo_core/train/callbacks/metric_saver.py lines 62-63) and writes them at intervals, one file per
save; a loss curve needs every step's.

A resumed run first drops the records past its checkpoint's step (steps a killed run logged but did
not save, which the resumed run redoes) and a torn last line (a run killed as it wrote), then
appends: one record per step (what OLMo-core logs twice for a step, at a save or the last step,
merged into it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict

from olmo_core.distributed.utils import get_rank
from olmo_core.train.callbacks import Callback

from ...launch.run_folder import METRICS_FILE, read_metrics


@dataclass
class MetricsFileCallback(Callback):
    def pre_train(self):
        path = Path(self.trainer.save_folder) / METRICS_FILE
        if get_rank() != 0 or not path.is_file():
            return
        step = self.trainer.global_step  # the checkpoint resumed from (0: a new run, nothing kept)
        metrics = read_metrics(path.parent) if step else {}  # a torn last line left out
        kept = [{"step": s, **m} for s, m in metrics.items() if s <= step]
        if len(kept) != len(path.read_text().splitlines()):
            tmp = path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(json.dumps(record) + "\n" for record in kept))
            tmp.replace(path)

    def log_metrics(self, step: int, metrics: Dict[str, float]):
        """Append the step's record; a step OLMo-core logs again (its save and last steps, an
        evaluation's metrics after the step's own) is merged into the last record, rewritten in
        place."""
        if get_rank() != 0:
            return
        path = Path(self.trainer.save_folder) / METRICS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {k: float(v) for k, v in metrics.items()}
        with path.open("a+b") as f:
            start = _last_line_start(f, f.seek(0, 2))
            f.seek(start)
            last = f.read().decode()
            if last.strip() and json.loads(last).get("step") == step:
                record = {**json.loads(last), **record}
                f.truncate(start)  # "a" mode: the write goes to the (new) end
            record.pop("step", None)
            f.write((json.dumps({"step": step, **record}) + "\n").encode())


def _last_line_start(f, end: int) -> int:
    """The offset of the last line of a file that ends with a newline (0 for one line or none)."""
    pos = end - 1  # its final newline
    while pos > 0:
        chunk = min(4096, pos)
        f.seek(pos - chunk)
        data = f.read(chunk)
        i = data.rfind(b"\n")
        if i >= 0:
            return pos - chunk + i + 1
        pos -= chunk
    return 0
