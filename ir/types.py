"""Small enumerations shared by every layer: invocation roles, output heads, node kinds."""

from __future__ import annotations

from enum import Enum

__all__ = ["Head", "NodeKind", "Role"]


class Role(str, Enum):
    """What a model invocation does (SPEC §3)."""

    GENERATION = "generation"  # autoregressive rollout: prefill over Lp, then Lr decode steps
    INFERENCE = "inference"  # one teacher-forced forward over Lp + Lr
    TRAINING = "training"  # forward, recompute, backward (4 forward-equivalents) + optimizer


class Head(str, Enum):
    """Output head of a model invocation: it changes the last layer's work and memory."""

    LM = "lm"  # vocabulary projection V·d (policy, reference)
    SCALAR = "scalar"  # one value per token, d weights (critic, reward)
    BOTH = "both"  # shared actor–critic backbone carrying both heads


class NodeKind(str, Enum):
    """Kinds of node in the executable DAG (SPEC §5)."""

    OP = "op"
    COMM = "comm"
    RESHARD = "reshard"
