"""The driver–worker protocol (SPEC §11): every call the driver makes of a worker, declared once.

The driver reaches a worker only through Ray, and only through
:class:`~rpeg.runtime.driver.group.WorkerGroup`: each remote call names a method of
:data:`PROTOCOL`, whose entry says how a group is called (:class:`Dispatch`) and how many
results a call returns. The worker process (:mod:`rpeg.runtime.worker.process`) serves exactly
these names and refuses any other; a test checks that :class:`~rpeg.runtime.worker.core.Worker`
has each with the declared parameters.

An OP node travels as a :class:`NodeCall`: what the worker needs to execute one node of the
lowered DAG (SPEC §11), typed, instead of a dictionary of strings. Nothing here imports torch.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ..ir.types import Role

__all__ = ["PROTOCOL", "Dispatch", "Method", "NodeCall", "ProtocolError", "check_call"]


class ProtocolError(TypeError):
    """A remote call the protocol does not declare, or one made in a way its declaration forbids
    (a group-wide method on part of a group)."""


class Dispatch(enum.Enum):
    """How the driver calls a method of a worker group's ranks (in the manner of verl's
    ``@register`` dispatch modes)."""

    #: Every live rank of one group, the same arguments, results in rank order. The ranks meet in
    #: collectives inside (TP, PP, FSDP), so calling part of a group would hang the rest.
    GROUP = "group"
    #: The ranks the driver names, each with its own arguments; no collective of the group inside.
    RANK = "rank"


@dataclass(frozen=True)
class Method:
    """One remote method: its dispatch, the results one call returns, and what it does."""

    dispatch: Dispatch
    does: str
    returns: int = 1


#: Every method the driver may call on a worker (the worker's own docstrings say the rest).
PROTOCOL: Mapping[str, Method] = MappingProxyType(
    {
        "op": Method(
            Dispatch.GROUP,
            "execute one OP node (a NodeCall): (meta, containers of the emitting ranks, publication)",
            returns=3,
        ),
        "fetch": Method(Dispatch.GROUP, "a data COMM node: copy containers from the object store"),
        "install": Method(Dispatch.GROUP, "a weight COMM/RESHARD node: install a published version"),
        "install_in_place": Method(
            Dispatch.GROUP,
            "a weight COMM/RESHARD node from a group on the same devices: read its kept shares in place",
        ),
        "publish": Method(
            Dispatch.GROUP, "this rank's shards of its current weights (or keep them in place)"
        ),
        "drop_published": Method(Dispatch.GROUP, "release a kept publication its readers have installed"),
        "publish_version": Method(Dispatch.GROUP, "this rank's shards of a kept past version"),
        "rollback": Method(Dispatch.GROUP, "return to the boundary before a step after a failure"),
        "info": Method(Dispatch.RANK, "where the worker runs, for the trace; a liveness probe"),
        "load": Method(Dispatch.RANK, "load this rank's checkpoint file"),
        "assembled": Method(Dispatch.RANK, "the whole model's full tensors from every rank's publication"),
        "full_shapes": Method(Dispatch.RANK, "every parameter's full shape, for transition planning"),
        "install_snapshot": Method(Dispatch.RANK, "keep a published past version as a snapshot"),
        "xfer_host": Method(Dispatch.RANK, "open the transition group's store"),
        "xfer_join": Method(Dispatch.RANK, "join the transition group"),
        "xfer_export": Method(Dispatch.RANK, "export cells of a unit before the transition's primitives"),
        "xfer_run": Method(Dispatch.RANK, "run this worker's transition copy entries"),
        "xfer_drop": Method(Dispatch.RANK, "drop exported cells"),
        "xfer_adopt": Method(Dispatch.RANK, "adopt assembled cells as this worker's state"),
    }
)


def check_call(method: str, *, whole_group: bool) -> Method:
    """The declaration of ``method``; a :class:`ProtocolError` when the protocol has none, or when
    a :attr:`Dispatch.GROUP` method is called on part of a group (``whole_group`` false)."""
    decl = PROTOCOL.get(method)
    if decl is None:
        raise ProtocolError(f"worker method {method!r} is not in the protocol ({', '.join(PROTOCOL)})")
    if decl.dispatch is Dispatch.GROUP and not whole_group:
        raise ProtocolError(f"worker method {method!r} is called on every live rank of a group, not on some")
    return decl


@dataclass(frozen=True)
class NodeCall:
    """One OP node as the worker executes it (built by
    :meth:`~rpeg.runtime.binding.Binding.node_call`).

    Attributes
    ----------
    vertex, role, step, phase
        The node: its vertex and role, RL step (segment-local) and length phase (0: the whole
        batch; SPEC §14.5).
    version
        Weight version the node runs with (a training node: the version it trains).
    output
        The data container it produces (``""``: none).
    algorithm
        ``ppo``, ``grpo``, ``remax`` or ``dpo``.
    mb
        Microbatches of the vertex (SPEC §14.2); ``None``: the group's.
    logits_chunk
        Positions per chunk of a chunked loss (SPEC §14.6); 0: unchunked.
    reward, reference, gen_logp, updates
        The workload's choices (SPEC §14.2, §14.8): ``"model"`` or ``"rule"`` reward, whether
        there is a reference model, whether a generation outputs its log-probs, optimizer
        updates per step of a training node.
    greedy
        The generation decodes greedily (ReMax's baseline rollout).
    prefix
        Source vertex → key prefix of its containers (ReMax's greedy rollouts, kept apart).
    publish
        A training node publishes its new weights at its end.
    publish_in_place
        The publication stays in the worker's process for the groups on the same devices, which
        install it in place (SPEC §14.4), instead of entering the object store.
    keep_previous
        A training node keeps its weights from before the update as a snapshot (a stale reader).
    tau, keep
        The model's staleness, and how many past versions to keep.
    rollout_version
        The version this step's rollouts were sampled with (``None``: ``version``).
    save
        Directory to save a training node's checkpoint files in (``None``: none).
    """

    vertex: str
    role: Role
    step: int
    phase: int
    version: int
    output: str
    algorithm: str
    mb: int | None = None
    logits_chunk: int = 0
    reward: str = "model"
    reference: bool = True
    gen_logp: bool = True
    updates: int = 1
    greedy: bool = False
    prefix: Mapping[str, str] = field(default_factory=dict)
    publish: bool = False
    publish_in_place: bool = False
    keep_previous: bool = False
    tau: int = 0
    keep: int = 0
    rollout_version: int | None = None
    save: str | None = None
