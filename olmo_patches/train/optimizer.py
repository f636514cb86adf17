"""The optimizer and learning-rate schedule of a spec, as OLMo-core configs: AdamW's parameter
groups (weight decay, muP's learning rates), cosine or power schedule, and the schedule's lag."""

from __future__ import annotations

from olmo_core.nn.transformer import TransformerConfig
from olmo_core.optim import AdamWConfig, CosWithWarmup, OptimGroupOverride, SkipStepAdamWConfig
from olmo_core.optim.scheduler import Scheduler, SchedulerUnits

from ..blocks import block_of
from ..config import ExperimentSpec
from ..optim.lagged import LaggedScheduler
from ..optim.power import PowerScheduler

__all__ = ["optim_groups", "scheduler", "lagged", "optimizer"]


def optim_groups(spec: ExperimentSpec, model: TransformerConfig) -> list[OptimGroupOverride]:
    """No weight decay on the embedding unless train.decay_embeddings (OLMo-2), nor on the 1-D
    tensors (norm gains, read off the model's parameters; an MoE router's flat weight is a matrix)
    unless train.decay_norms. An untied LM head's matrix is always decayed (OLMo-2 and lm-engine
    alike; tied, it is the embedding). The block kind adds its own learning-rate groups (blocks/:
    the variable-width paper's muP trains the hidden matrices at lr / m_width)."""
    no_decay = [] if spec.train.decay_embeddings else ["embeddings.weight"]
    if not spec.train.decay_norms:
        no_decay += [
            n
            for n, p in model.build(init_device="meta").named_parameters()
            if p.ndim == 1 and not n.endswith("router.weight")
        ]
    groups = [OptimGroupOverride(params=no_decay, opts=dict(weight_decay=0.0))] if no_decay else []
    # the block's own learning rates
    for params, lr_multiplier in block_of(spec.model).optim_groups(spec.model):
        groups.append(
            OptimGroupOverride(params=params, opts=dict(lr=spec.train.lr * lr_multiplier))
        )
    return groups


def scheduler(spec: ExperimentSpec) -> Scheduler:
    """Cosine with linear warmup (OLMo-2), or lm-engine's power schedule (the variable-width
    paper)."""
    t = spec.train
    if t.schedule == "power":
        p = t.power
        assert p.a is not None and p.c is not None  # validate()
        return PowerScheduler(a=p.a, b=p.b, c=p.c, lr0=t.lr, warmup=t.warmup_steps or 0)
    warmup = t.warmup_tokens if t.warmup_tokens is not None else t.warmup_steps
    units = (
        SchedulerUnits.tokens
        if t.warmup_tokens is not None or t.schedule_tokens
        else SchedulerUnits.steps
    )
    if units == SchedulerUnits.tokens and t.warmup_steps is not None:
        warmup = t.warmup_steps * t.global_batch_size * spec.data.sequence_length
    return CosWithWarmup(
        units=units, warmup=warmup or 0, alpha_f=t.final_lr_ratio, t_max=t.schedule_tokens
    )


def lagged(scheduler: Scheduler, spec: ExperimentSpec) -> Scheduler:
    """train.schedule_lag steps behind (Megatron's convention), in the schedule's units."""
    t = spec.train
    if not t.schedule_lag:
        return scheduler
    per_step = (
        t.global_batch_size * spec.data.sequence_length
        if scheduler.units == SchedulerUnits.tokens
        else 1
    )
    return LaggedScheduler(units=scheduler.units, inner=scheduler, lag=t.schedule_lag * per_step)


def optimizer(spec: ExperimentSpec, model, device: str):
    """OLMo-core's optimizer config for ``spec``. AdamW on CUDA takes torch's fused kernel (one
    kernel for every parameter's update; torch.optim.AdamW's ``fused=True``, CUDA tensors only); on
    a CPU, torch's default. SkipStepAdamW is OLMo-core's own (foreach kernels, its default)."""
    t = spec.train
    kwargs = dict(
        lr=t.lr,
        betas=(t.betas[0], t.betas[1]),
        eps=t.eps,
        weight_decay=t.weight_decay,
        group_overrides=optim_groups(spec, model),
    )
    if t.optimizer == "skip_step_adamw":
        return SkipStepAdamWConfig(**kwargs)
    return AdamWConfig(**kwargs, fused=True if device == "cuda" else None)
