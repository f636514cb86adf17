"""Weights & Biases through OLMo-core's WandBCallback, offline too, one wandb run per training run.

What OLMo-core lacks (olmo_core/train/callbacks/wandb.py): its callback refuses to start without
``WANDB_API_KEY`` (line 127), even offline; starts a new wandb run at every resume (its
``wandb.init`` has no id, line 133); asks the server for cancel tags every
``cancel_check_interval`` steps (line 150; OLMo-core's default 25, 1 here: experiment.py sets it so
that SIGTERM stops the run at the next step), offline too; and finishes with ``quiet=True`` (line
122), which wandb >= 0.29 no longer takes. ``WANDB_MODE=offline`` (or ``disabled``) needs no key
here, and a resumed run continues its wandb run (the id is kept in ``SAVE/wandb_id``).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from olmo_core.distributed.utils import get_rank
from olmo_core.train.callbacks import WandBCallback

log = logging.getLogger(__name__)


@dataclass
class OfflineAwareWandBCallback(WandBCallback):
    """WandBCallback that works offline (no API key, no API calls) and resumes its own run."""

    def pre_train(self):
        if not (self.enabled and get_rank() == 0):
            return
        id_file = Path(self.trainer.save_folder) / "wandb_id"
        run_id = id_file.read_text().strip() if id_file.exists() else None
        wandb_dir = Path(self.trainer.save_folder) / "wandb"
        wandb_dir.mkdir(parents=True, exist_ok=True)
        self.wandb.init(
            dir=wandb_dir,
            project=self.project,
            entity=self.entity,
            group=self.group,
            name=self.name,
            tags=self.tags,
            notes=self.notes,
            config=self.config,
            id=run_id,
            resume="allow",
        )
        if run_id is None and self.run is not None:
            id_file.write_text(self.run.id)
        self._run_path = self.run.path if self.run is not None else None  # type: ignore

    def post_step(self):
        """OLMo-core's cancel check, a bookkeeping op every ``cancel_check_interval`` steps, asks
        the server: none offline.
        (OLMo-core 3.0.0's bookkeeping queue also races when one check ends as the next is
        submitted: a KeyError.)"""
        offline = os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun")
        if not offline and os.environ.get("WANDB_API_KEY"):
            super().post_step()

    def finalize(self, exit_code: int = 0):
        """OLMo-core's, without ``quiet=True``: wandb 0.29 removed it, OLMo-core 3.0.0 passes it."""
        if not self.finalized:
            log.log(logging.WARNING if exit_code > 0 else logging.INFO, "Finalizing W&B run...")
            self.wandb.finish(exit_code=exit_code)
            self._finalized = True


def wandb_callback(project: Optional[str], name: str) -> Optional[WandBCallback]:
    """A wandb callback when asked for (``run.wandb_project``) and possible (``wandb``
    installed)."""
    if not project:
        return None
    if importlib.util.find_spec("wandb") is None:
        log.info(
            "run.wandb_project is set but wandb is not installed: logging to metrics.jsonl only"
        )
        return None
    return OfflineAwareWandBCallback(name=name, project=project, enabled=True)
