"""Small enumerations shared by every layer: invocation roles, output heads, node kinds,
activation-recomputation modes."""

from __future__ import annotations

from enum import Enum

__all__ = ["Head", "NodeKind", "Recompute", "Role"]


class Role(str, Enum):
    """What a model invocation does (SPEC §3)."""

    GENERATION = "generation"  # autoregressive rollout: prefill over Lp, then Lr decode steps
    INFERENCE = "inference"  # one teacher-forced forward over Lp + Lr
    TRAINING = "training"  # forward, recompute (per Recompute mode), backward + optimizer


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


class Recompute(str, Enum):
    """Activation recomputation of a training invocation: what the backward pass recomputes
    instead of keeping it resident (``docs/cost-model.md`` §1, §4).

    Only training invocations have a choice; every other role carries :attr:`FULL`, a neutral
    value the cost model ignores (no backward pass, nothing to recompute).
    """

    NONE = "none"  # keep every layer's activations: 3 forward-equivalents, the most memory
    SELECTIVE = "selective"  # recompute the attention core (scores, softmax): no ℓ² activations
    FULL = "full"  # checkpoint layer inputs, recompute the whole forward: 4 forward-equivalents
