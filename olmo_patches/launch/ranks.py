"""The ranks a run has (torchrun's environment, or a planned launch): no torch, so a script can plan
its ranks before it imports the training stack."""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["Layout"]


@dataclass(frozen=True)
class Layout:
    """The ranks a run has: ``world_size`` processes, ``local`` per node, on ``nodes`` nodes (as
    OLMo-core counts them for HSDP: NUM_NODES, else world / local)."""

    world_size: int = 1
    local: int = 1
    nodes: int = 1

    @classmethod
    def plan(cls, nproc_per_node: int, nodes: int = 1) -> "Layout":
        return cls(nproc_per_node * nodes, nproc_per_node, nodes)

    @classmethod
    def from_env(cls) -> "Layout":
        """torchrun's WORLD_SIZE and LOCAL_WORLD_SIZE; one process without them."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        return cls(world, local, int(os.environ.get("NUM_NODES", 0)) or max(world // local, 1))

    def __str__(self) -> str:
        return f"{_count(self.world_size, 'rank')} ({_count(self.nodes, 'node')} x {self.local})"


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"
