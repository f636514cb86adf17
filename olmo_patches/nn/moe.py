"""A mixture of experts at one layer's width (paper 2's 3B MoE), from OLMo-core's own MoE.

Each layer l of a variable-width model gets OLMo-core's dropless MoE at width w_l: its linear router
(bias-free, w_l -> E, reading the layer's normalised input ln_2(h')), softmax over the E logits,
top-k, the k weights renormalised to sum 1 (= lm-engine's softmax over the k selected logits,
``normalized_topk``), dropless SwiGLU experts of hidden I_l = round(w_l expert_hidden / h), no
shared expert, and OLMo-core's load-balancing loss and router z-loss. The block is OLMo-core's
:class:`MoETransformerBlock` with the residual multiplier on both branches (lm-engine's
``m_residual``).

The authors' aux loss (lm-engine ``mlp_blocks/moe.py:284-292, 393-416``;
``model_wrapper/pretraining.py``), per layer, summed over layers, times ``router_aux_loss_coef``
0.01:

    aux_l = E sum_e P_e f_e + 0.1 mean_t logsumexp(logits_t)^2

(P_e the mean full-softmax probability, f_e the fraction of the k T assignments). OLMo-core's
``local_batch`` load-balancing loss is (E / k) sum_e count_e P_e / T = E sum_e f_e P_e, and its
z-loss is mean_t logsumexp^2: so ``lb_loss_weight`` 0.01 and ``z_loss_weight`` 0.001 with
``scale_loss_by_num_layers=False`` (summed, not averaged, over layers) give the authors' loss.
OLMo-core divides by the rank's batch tokens (``loss_div_factor``) where the authors divide by
grad-accumulation steps: equal for equal micro-batches. OLMo-core's router also computes its logits
in float32 (lm-engine's ``gate`` runs in the training dtype).

What the counts f (and the mean P) are taken over, ``load_balance`` (:class:`BalancedRouter`):

- ``micro_batch``: the rank's micro-batch (OLMo-core's ``local_batch``): the loss depends on how the
  global batch is split over ranks and micro-batches.
- ``data_parallel``: f over the micro-batches of one pass on every data-parallel rank, P the rank's
  own (lm-engine ``lm_engine/modeling_utils/mlp_blocks/moe/module.py:317-340`` at commit 36bad91:
  ``expert_frequency`` all-reduced over the data-parallel group in each forward): depends on the
  split.
- ``global_batch``: f and P over the T tokens of the whole step, every rank and micro-batch
  (global-batch load balance, Qiu et al. 2025, arXiv:2501.11873), so the loss and its gradient are
  the same at any world size and micro-batch size. With several micro-batches a rank first routes
  them all without gradients (one forward pass more, :func:`count_experts_first`) and the counts are
  all-reduced; with one, they are all-reduced in the forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple, Union

import olmo_core.ops.moe as moe_ops
import torch
import torch.distributed as dist
from olmo_core.config import StrEnum
from olmo_core.data.utils import get_labels, split_batch
from olmo_core.nn.buffer_cache import BufferCache
from olmo_core.nn.moe import (
    DroplessMoE,
    MoEBase,
    MoEConfig,
    MoELinearRouter,
    MoERouterConfig,
    MoEType,
)
from olmo_core.nn.moe.mlp import DroplessMoEMLP
from olmo_core.nn.moe.parallel_mlp import ParallelDroplessMLP
from olmo_core.nn.transformer.block import MoETransformerBlock

__all__ = [
    "BalancedRouter",
    "BalancedRouterConfig",
    "LayerMoEConfig",
    "LoadBalance",
    "ScaledMoETransformerBlock",
    "PortableDroplessMLP",
    "PortableDroplessMoE",
    "count_experts_first",
]


class LoadBalance(StrEnum):
    """The tokens the load-balancing loss's f and P are taken over (the module's docstring)."""

    global_batch = "global_batch"
    data_parallel = "data_parallel"
    micro_batch = "micro_batch"


def _all_reduced(counts: torch.Tensor, group) -> Tuple[torch.Tensor, int]:
    """``counts`` summed over ``group`` (None: every rank), and its number of ranks."""
    if not (dist.is_available() and dist.is_initialized()):
        return counts, 1
    counts = counts.clone()
    dist.all_reduce(counts, group=group)
    return counts, dist.get_world_size(group)


class BalancedRouter(MoELinearRouter):
    """OLMo-core's linear router whose load-balancing loss takes f and P over ``load_balance``
    (``micro_batch``: OLMo-core's own loss). Routing, z-loss and metrics are OLMo-core's; the logged
    load-balancing loss is this loss (each micro-batch's term, summed)."""

    def __init__(self, *, load_balance: str = "micro_batch", **kwargs):
        super().__init__(**kwargs)
        self.load_balance = LoadBalance(load_balance)
        self.tally: Optional[torch.Tensor] = (
            None  # counts routed without gradients (count_experts_first)
        )
        self.step_counts: Optional[torch.Tensor] = (
            None  # the step's counts, every rank and micro-batch
        )
        self.step_ranks = 1  # the ranks step_counts was summed over
        self._logits: Optional[torch.Tensor] = None

    def get_expert_logits(self, x: torch.Tensor) -> torch.Tensor:
        self._logits = super().get_expert_logits(x)
        return self._logits

    def forward(
        self, x: torch.Tensor, *, loss_div_factor: Optional[Union[torch.Tensor, float]] = None
    ):
        if self.load_balance == LoadBalance.micro_batch or self.lb_loss_weight is None:
            return super().forward(x, loss_div_factor=loss_div_factor)
        if self.tp_mesh is not None or self.cp_mesh is not None:
            raise NotImplementedError(
                "load_balance other than micro_batch with tensor or context parallelism"
            )
        # OLMo-core's forward without its loss
        weight, self.lb_loss_weight = (self.lb_loss_weight, None)
        try:
            expert_weights, expert_indices, counts, aux_loss = super().forward(
                x, loss_div_factor=loss_div_factor
            )
        finally:
            self.lb_loss_weight = weight
        logits, self._logits = self._logits, None
        if self.training and not torch.is_grad_enabled() and self.tally is not None:
            self.tally += counts
        if not (self.training and torch.is_grad_enabled()):
            return expert_weights, expert_indices, counts, aux_loss
        assert logits is not None
        with torch.autocast(enabled=False, device_type=x.device.type):
            lb_loss = self._balance_loss(
                logits.float().view(-1, self.num_experts), counts, loss_div_factor
            )
        self.load_balancing_loss += lb_loss.detach()
        aux_loss = weight * lb_loss if aux_loss is None else aux_loss + weight * lb_loss
        return expert_weights, expert_indices, counts, aux_loss

    def _balance_loss(
        self, logits: torch.Tensor, counts: torch.Tensor, loss_div_factor
    ) -> torch.Tensor:
        """This micro-batch's term of E sum_e f_e P_e."""
        E, k = self.num_experts, self.top_k
        scores = (
            logits.softmax(dim=-1) if self.gating_function == "softmax" else logits.sigmoid() + 1e-7
        )
        # sigmoid gating normalised, as OLMo-core's
        scores = scores / scores.sum(dim=-1, keepdim=True)
        # lm-engine: f over the ranks, P the rank's
        if self.load_balance == LoadBalance.data_parallel:
            total, _ = _all_reduced(counts, self.group)
            f = (total.double() / total.sum()).to(scores.dtype)
            # as OLMo-core's
            share = 1.0 if loss_div_factor is None else scores.shape[0] / loss_div_factor
            return E * torch.dot(f, scores.mean(dim=0)) * share
        # global_batch: a rank's term is W E sum_e C_e sum_t p_te / (k T^2) (C_e the step's counts
        # over W ranks, T its tokens): the ranks' mean of the gradients is then that of E sum_e f_e
        # P_e.
        if self.step_counts is not None:
            total, ranks = self.step_counts, self.step_ranks
        else:
            total, ranks = _all_reduced(counts, self.group)
        T = total.sum().double() / k
        coef = (ranks * E / k) * total.double() / T**2
        return torch.dot(coef.to(scores.dtype), scores.sum(dim=0))


@dataclass
class BalancedRouterConfig(MoERouterConfig):
    """OLMo-core's router config, built as :class:`BalancedRouter`."""

    load_balance: str = "micro_batch"  # global_batch | data_parallel | micro_batch (LoadBalance)

    def build(self, d_model: int, num_experts, **kwargs) -> BalancedRouter:  # type: ignore[override]
        options = self.as_dict(exclude_none=True, recurse=False)
        options.pop("name")
        if (dtype := options.pop("dtype", None)) is not None:
            kwargs["dtype"] = dtype.as_pt()
        kwargs.pop("lb_loss_granularity", None)  # the router's own load_balance
        return BalancedRouter(d_model=d_model, num_experts=num_experts, **options, **kwargs)


def count_experts_first(train_module) -> None:
    """Let OLMo-core's train module balance the experts over the global batch (its ``train_batch``
    wrapped on the instance): before a step of several micro-batches, each rank routes them all
    without gradients, and every layer's counts are all-reduced over the data-parallel group, so
    each micro-batch's load-balancing term uses the step's counts. A model without global_batch
    routers is left as it is."""
    routers = [
        m
        for m in train_module.model.modules()
        if isinstance(m, BalancedRouter)
        and m.load_balance == LoadBalance.global_batch
        and m.lb_loss_weight
    ]
    if not routers:
        return
    train_batch, group = train_module.train_batch, train_module.dp_process_group
    for router in routers:
        router.group = group

    def counted_train_batch(batch: Dict[str, Any], dry_run: bool = False):
        micro_batches = split_batch(
            batch, max(train_module.rank_microbatch_size // batch["input_ids"].shape[1], 1)
        )
        try:
            if len(micro_batches) > 1:
                for router in routers:
                    router.tally = torch.zeros(
                        router.num_experts, dtype=torch.long, device=train_module.device
                    )
                train_module._set_model_mode("train")
                with torch.no_grad():
                    for micro_batch in micro_batches:
                        micro_batch.setdefault(
                            "labels", get_labels(micro_batch, train_module.label_ignore_index)
                        )
                        input_ids, labels, kwargs = train_module._prepare_batch(micro_batch)
                        train_module.model_forward(
                            input_ids,
                            labels=labels,
                            loss_reduction="sum",
                            return_logits=False,
                            **kwargs,
                        )
                counts, ranks = _all_reduced(torch.stack([r.tally for r in routers]), group)
                for router, c in zip(routers, counts):
                    router.step_counts, router.step_ranks = c, ranks
            return train_batch(batch, dry_run=dry_run)
        finally:
            for router in routers:
                router.step_counts, router.tally = None, None

    train_module.train_batch = counted_train_batch


@dataclass
class LayerMoEConfig(MoEConfig):
    """OLMo-core's ``MoEConfig`` for one layer (``hidden_size`` = I_l) with SwiGLU experts (a
    subclass per other kind of expert: hourglass_moe.HourglassMoEConfig)."""

    @classmethod
    def authors(
        cls,
        *,
        num_experts: int,
        top_k: int,
        hidden_size: int,
        lb_loss_weight: float,
        z_loss_weight: float,
        load_balance: str = "micro_batch",
    ) -> "LayerMoEConfig":
        """The authors' routing: top-k weights renormalised, losses summed over layers, dropless;
        ``load_balance``: what the load-balancing loss counts over (:class:`LoadBalance`)."""
        return cls(
            name=MoEType.dropless,
            num_experts=num_experts,
            hidden_size=hidden_size,
            # k = 1: weight 1, as lm-engine's
            router=BalancedRouterConfig(
                top_k=top_k, normalize_expert_weights=1.0, load_balance=load_balance
            ),
            lb_loss_weight=lb_loss_weight or None,
            z_loss_weight=z_loss_weight or None,
            scale_loss_by_num_layers=False,
        )

    def build(  # type: ignore[override]
        self,
        d_model: int,
        *,
        n_layers: int = 1,
        init_device: str = "cpu",
        cache: Optional[BufferCache] = None,
    ) -> MoEBase:
        """THE place a layer's MoE is built: width ``d_model`` = w_l, expert hidden ``hidden_size``
        = I_l (OLMo-core's ``MoEConfig.build``; a subclass builds its own kind of experts)."""
        return PortableDroplessMoE(**self._module_kwargs(d_model, n_layers, init_device, cache))

    def _module_kwargs(
        self,
        d_model: int,
        n_layers: int,
        init_device: str,
        cache: Optional[BufferCache],
        drop: tuple = ("name",),
    ) -> dict:
        """OLMo-core's MoE constructor arguments for a layer of width ``d_model`` (this config's
        fields less ``drop``)."""
        kwargs = self.as_dict(exclude_none=True, recurse=False)
        for key in drop:
            kwargs.pop(key, None)
        kwargs.update(
            d_model=d_model,
            n_layers=n_layers,
            init_device=init_device,
            dtype=kwargs.pop("dtype").as_pt(),
            cache=cache,
        )
        return kwargs


class PortableDroplessMLP(ParallelDroplessMLP):
    """OLMo-core's dropless expert dispatch; without its Triton kernels (a CPU, or no ``triton``)
    the permutation is plain PyTorch indexing: each of the k T (token, expert) pairs in expert
    order, then the weighted outputs summed back per token (megablocks' ``gather`` /
    ``scatter``)."""

    def permute_and_compute(  # type: ignore[override]
        self,
        x: torch.Tensor,
        *,
        batch_size_per_expert: torch.Tensor,
        indices: torch.Tensor,
        bin_ids: torch.Tensor,
        expert_weights: Optional[torch.Tensor],
        bins: torch.Tensor,
        top_k: int,
    ) -> torch.Tensor:
        if x.is_cuda and moe_ops.kernels is not None:
            return super().permute_and_compute(
                x,
                batch_size_per_expert=batch_size_per_expert,
                indices=indices,
                bin_ids=bin_ids,
                expert_weights=expert_weights,
                bins=bins,
                top_k=top_k,
            )
        x = x.view(-1, x.shape[-1])
        # indices: positions in the flattened (T, k) assignments, by expert
        token = indices.long() // top_k
        y = self.mlp(x[token], batch_size_per_expert)
        if expert_weights is not None:
            y = y * expert_weights[indices.long()].unsqueeze(-1).to(y.dtype)
        return y.new_zeros(x.shape[0], y.shape[-1]).index_add_(0, token, y)


class PortableDroplessMoE(DroplessMoE):
    """OLMo-core's ``DroplessMoE`` whose dispatch also runs without Triton
    (:class:`PortableDroplessMLP`)."""

    def _init_parallel_mlp(  # type: ignore[override]
        self,
        *,
        d_model: int,
        num_experts: int,
        hidden_size: int,
        dtype: torch.dtype = torch.float32,
        init_device: str = "cpu",
        cache: Optional[BufferCache] = None,
    ) -> ParallelDroplessMLP:
        mlp = DroplessMoEMLP(
            d_model=d_model,
            num_experts=num_experts,
            hidden_size=hidden_size,
            dtype=dtype,
            init_device=init_device,
        )
        return PortableDroplessMLP(mlp=mlp, top_k=self.router.top_k, cache=cache)


class ScaledMoETransformerBlock(MoETransformerBlock):
    """OLMo-core's pre-norm MoE block with the residual multiplier on both branches (lm-engine
    layer.py:45-72): h = x + alpha Attn(ln_1 x); out = h + alpha MoE(ln_2 h)."""

    def __init__(self, *, residual_alpha: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        self.residual_alpha = residual_alpha

    def forward(
        self,
        x: torch.Tensor,
        *,
        loss_div_factor: Optional[Union[torch.Tensor, float]] = None,
        **kwargs,
    ) -> torch.Tensor:
        a = self.residual_alpha
        h = x + a * self.dropout(self.attention(self.attention_norm(x), **kwargs))
        return h + a * self.dropout(
            self.feed_forward_moe(self.feed_forward_norm(h), loss_div_factor=loss_div_factor)
        )
