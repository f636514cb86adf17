"""Train a config, sending this process a signal after a given step (test helper).

    python tests/_signal_at_step.py SIGNAME STEP CONFIG [key=value ...]

The signal is raised from a Trainer callback right after step STEP, so where a run is cut is
deterministic; what happens next (OLMo-core's SIGTERM handler, or death by SIGKILL) is real.
SIGNAME ``NAN`` instead makes one weight NaN just before step STEP (a diverged run: its loss at
STEP is NaN).
"""

import os
import signal
import sys
from dataclasses import dataclass

import torch
from olmo_core.train.callbacks import Callback

import olmo_patches.train.run as training
from olmo_patches.cli import load_or_exit


@dataclass
class SignalAtStep(Callback):
    signame: str = "SIGTERM"
    at_step: int = 1

    def pre_step(self, batch):
        if self.signame == "NAN" and self.step == self.at_step:
            with torch.no_grad():
                weight = next(
                    p
                    for n, p in self.trainer.train_module.model.named_parameters()
                    if n.startswith("blocks.")
                )
                weight.view(-1)[0] = float("nan")

    def post_step(self):
        if self.signame != "NAN" and self.step == self.at_step:
            os.kill(os.getpid(), getattr(signal, self.signame))


def with_signal(signame: str, at_step: int):
    """Patch olmo_patches.train.build_experiment to add the callback; returns the original."""
    return with_callback(SignalAtStep(signame, at_step))


def with_callback(callback: Callback):
    """Patch olmo_patches.train.build_experiment to add ``callback``; returns the original."""
    original = training.build_experiment

    def build(*args, **kwargs):
        exp = original(*args, **kwargs)
        exp.trainer = exp.trainer.with_callback("fault", callback)
        return exp

    training.build_experiment = build
    return original


if __name__ == "__main__":
    signame, step, config, *overrides = sys.argv[1:]
    with_signal(signame, int(step))
    training.train(load_or_exit(config, overrides))
