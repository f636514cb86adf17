"""lm-engine's power learning-rate schedule (the variable-width paper's runs), as an OLMo-core
scheduler.

lm-engine ``optimization/scheduler.py`` (``PowerScheduler``, a torch ``LambdaLR``) multiplies every
param group's base lr by

    P(n)      = min(1, (a / lr0) (n c)^b)
    factor(n) = n / W P(W)   if n <= W   (linear warmup from 0)
              = P(n)         otherwise   (no constant phase, no decay-to-min, no floor)

with lr0 the lr of the optimizer's first group (the base lr), c the tokens per step (so n c is the
tokens seen) and n counted from 0: lm-engine's update i (1-based) uses n = i - 1, so the first
update has lr 0. OLMo-core increments ``global_step`` before it sets the lr, so n = global_step - 1
here. (n c = 0 happens only without warmup; lm-engine then divides by zero, here the cap 1 applies.)
OLMo-core's own ``PowerLR`` is another curve (peak = lr at W, then lr (n / W)^b, a linear decay
tail), hence this class. The schedule is a function of the step alone: checkpoints need no scheduler
state and resume as is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

import torch
from olmo_core.exceptions import OLMoConfigurationError
from olmo_core.optim.scheduler import Scheduler, SchedulerUnits

__all__ = ["PowerScheduler"]


@Scheduler.register("power")
@dataclass
class PowerScheduler(Scheduler):
    """lr_g(n) = lr_g factor(n) (module docstring); ``units`` must be steps."""

    a: float = 0.0  # lm-engine's a (the authors: 4 x sequences per step)
    b: float = 0.0  # exponent (the authors: -0.566)
    c: float = 1.0  # tokens per step (the authors: sequences per step x 4096)
    lr0: float = 0.0  # the base lr that a is relative to (lm-engine: param_groups[0]["lr"])
    warmup: int = 0  # W, steps of linear warmup

    def __post_init__(self, *args):  # args: Registrable's init-only fields
        del args
        if self.units != SchedulerUnits.steps:
            raise OLMoConfigurationError("the power schedule counts steps")
        if self.a <= 0 or self.c <= 0 or self.lr0 <= 0 or self.warmup < 0:
            raise OLMoConfigurationError("the power schedule needs a, c, lr0 > 0 and warmup >= 0")

    def _power(self, n: int) -> float:
        tokens = n * self.c
        return 1.0 if tokens == 0 else min(1.0, self.a / self.lr0 * math.pow(tokens, self.b))

    def factor(self, n: int) -> float:
        """The multiplier of every group's base lr at lm-engine's step n (0-based)."""
        if self.warmup > 0 and n <= self.warmup:
            return n * self._power(self.warmup) / self.warmup
        return self._power(n)

    def get_lr(
        self, initial_lr: Union[float, torch.Tensor], current: int, t_max: int
    ) -> Union[float, torch.Tensor]:
        del t_max  # the power law runs to the last step
        return initial_lr * self.factor(max(current - 1, 0))
