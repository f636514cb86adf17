"""Megatron's step convention for any OLMo-core learning-rate schedule.

OLMo-core evaluates the schedule f at the trainer's step count after incrementing it, so update n
(n = 1..N) runs at f(n). Megatron-LM's ``OptimizerParamScheduler`` steps after the update, so update
n runs at f(n - 1): the first update has lr 0 under a warmup from 0, the peak comes one update
later, and the last update runs at f(N - 1). :class:`LaggedScheduler` evaluates its inner schedule
``lag`` units behind (1 step, or a step's tokens with token units) to reproduce that.
"""

from dataclasses import dataclass, field
from typing import Union

import torch
from olmo_core.optim.scheduler import CosWithWarmup, Scheduler

__all__ = ["LaggedScheduler"]


@dataclass
class LaggedScheduler(Scheduler):
    """``inner`` evaluated at ``current - lag`` (never below 0); build it with
    ``units=inner.units``."""

    inner: Scheduler = field(default_factory=CosWithWarmup)
    lag: int = 1  # in the inner schedule's units

    def get_lr(
        self, initial_lr: Union[float, torch.Tensor], current: int, t_max: int
    ) -> Union[float, torch.Tensor]:
        return self.inner.get_lr(initial_lr, max(current - self.lag, 0), t_max)
