"""α–β costs of the collectives and point-to-point transfers used by the cost model (SPEC §6).

A transfer of ``M`` bytes over a :class:`~rpeg.ir.hardware.Link` ``(α, β)`` costs ``α + M·β``.
Collectives over ``p`` ranks use the ring estimates (reductions and gathers) and a pairwise
exchange (all-to-all); every collective costs nothing when ``p = 1``. The message-size convention
follows the paper's Table II: ``M`` is the per-rank buffer for AllReduce and ReduceScatter, the
gathered buffer for AllGather, the bytes each rank exchanges in total for AlltoAll, and the
transferred payload for P2P.

The caller picks the link: the collective or P2P pair of the slowest tier the ranks span.
"""

from __future__ import annotations

from ..ir.hardware import Link

__all__ = [
    "allgather_time",
    "allreduce_time",
    "alltoall_time",
    "flex_dispatch_time",
    "hierarchical_alltoall_time",
    "one_kernel_allreduce_time",
    "p2p_time",
    "reduce_scatter_time",
    "untouched_share",
]


def _check(p: int, nbytes: float, local: int | None = None, who: str = "") -> None:
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise ValueError(f"collective rank count p must be a positive integer, got {p!r}")
    if not nbytes >= 0.0:
        raise ValueError(f"message size nbytes must be non-negative, got {nbytes!r}")
    if local is not None and not 1 <= local <= p:
        raise ValueError(f"{who}: local must be in [1, p={p}], got {local!r}")


def allreduce_time(p: int, nbytes: float, link: Link) -> float:
    """Ring AllReduce: ``2(p−1)·α + 2·((p−1)/p)·M·β`` (SPEC §6); ``0`` for ``p = 1``.

    Parameters
    ----------
    p
        Number of participating ranks.
    nbytes
        ``M``, bytes of the buffer each rank contributes (and receives reduced).
    link
        ``(α, β)`` of the collective at the tier the ranks span.

    Returns
    -------
    float
        Seconds.
    """
    _check(p, nbytes)
    if p == 1:
        return 0.0
    return 2.0 * (p - 1) * link.alpha + 2.0 * (p - 1) / p * nbytes * link.beta


def one_kernel_allreduce_time(p: int, nbytes: float, link: Link) -> float:
    """An inference engine's one-kernel AllReduce over NVLink (vLLM's custom all-reduce):
    ``α + 2·((p−1)/p)·M·β``; ``0`` for ``p = 1`` (docs/cost-model.md §8, "The engine's
    all-reduce").

    One launch whose ranks read each other's buffers through peer-to-peer mappings: the start-up
    cost is paid once, not once per ring step as in :func:`allreduce_time`, and the bytes are the
    ring's at the kernel's own bus bandwidth ``1/β``.

    Parameters
    ----------
    p
        Number of participating ranks.
    nbytes
        ``M``, bytes of the buffer each rank contributes (and receives reduced).
    link
        ``(α, β)`` of the kernel (:attr:`rpeg.ir.hardware.EngineStep.allreduce`).

    Returns
    -------
    float
        Seconds.
    """
    _check(p, nbytes)
    if p == 1:
        return 0.0
    return link.alpha + 2.0 * (p - 1) / p * nbytes * link.beta


def allgather_time(p: int, nbytes: float, link: Link) -> float:
    """Ring AllGather: ``(p−1)·α + ((p−1)/p)·M·β`` (SPEC §6); ``0`` for ``p = 1``.

    Parameters
    ----------
    p
        Number of participating ranks.
    nbytes
        ``M``, bytes of the gathered (full) buffer.
    link
        ``(α, β)`` of the collective at the tier the ranks span.

    Returns
    -------
    float
        Seconds.
    """
    _check(p, nbytes)
    if p == 1:
        return 0.0
    return (p - 1) * link.alpha + (p - 1) / p * nbytes * link.beta


def reduce_scatter_time(p: int, nbytes: float, link: Link) -> float:
    """Ring ReduceScatter: ``(p−1)·α + ((p−1)/p)·M·β`` (SPEC §6); ``0`` for ``p = 1``.

    Parameters
    ----------
    p
        Number of participating ranks.
    nbytes
        ``M``, bytes of the input buffer each rank contributes.
    link
        ``(α, β)`` of the collective at the tier the ranks span.

    Returns
    -------
    float
        Seconds.
    """
    return allgather_time(p, nbytes, link)  # a ring moves the same bytes in the same steps


def alltoall_time(p: int, nbytes: float, link: Link) -> float:
    """Pairwise-exchange AlltoAll: ``(p−1)·α + M·β`` (SPEC §6); ``0`` for ``p = 1``.

    Parameters
    ----------
    p
        Number of participating ranks.
    nbytes
        ``M``, bytes each rank exchanges in total (its locally kept share included, an upper
        bound).
    link
        ``(α, β)`` of the collective at the tier the ranks span.

    Returns
    -------
    float
        Seconds.
    """
    _check(p, nbytes)
    if p == 1:
        return 0.0
    return (p - 1) * link.alpha + nbytes * link.beta


def hierarchical_alltoall_time(p: int, local: int, nbytes: float, intra: Link, inter: Link) -> float:
    """AlltoAll over ``p`` ranks, ``local`` of them on each node: every rank sends its ``M``
    bytes to the ``p − 1`` others in equal parts, ``(local − 1)/(p − 1)`` of them over the node's
    own link and ``(p − local)/(p − 1)`` over the link between nodes, both at once (NCCL posts every
    send and receive together; the two go over different wires):

        max((g − 1)·α₀ + M·(g − 1)/(p − 1)·β₀,  (p − g)·α + M·(p − g)/(p − 1)·β)

    with ``g = local``. ``g = 1`` is :func:`alltoall_time` on the inter-node link; ``g = p``
    on the intra-node one (``docs/cost-model.md`` §10 "Time").

    Parameters
    ----------
    p
        Number of participating ranks.
    local
        Ranks of the group on each node, ``1 ≤ g ≤ p``.
    nbytes
        ``M``, bytes each rank sends to the others.
    intra, inter
        ``(α, β)`` of the collective inside a node and at the tier the group spans.

    Returns
    -------
    float
        Seconds.
    """
    _check(p, nbytes, local, "hierarchical_alltoall_time")
    if p == 1:
        return 0.0
    near = (local - 1) * intra.alpha + nbytes * (local - 1) / (p - 1) * intra.beta
    far = (p - local) * inter.alpha + nbytes * (p - local) / (p - 1) * inter.beta
    return max(near, far)


def untouched_share(experts: int, held: int, topk: int) -> float:
    """The chance that a token's ``k`` distinct experts, drawn uniformly from ``E``, miss all
    ``m`` experts a rank or a node holds: ``C(E − m, k)/C(E, k) = Π_{i<k} (E − m − i)/(E − i)``.

    Parameters
    ----------
    experts, held, topk
        ``E``, ``m`` and ``k``, ``0 ≤ m ≤ E``, ``1 ≤ k ≤ E``.

    Returns
    -------
    float
        In ``[0, 1]``.
    """
    if not 0 <= held <= experts or not 1 <= topk <= experts:
        raise ValueError(
            f"untouched_share: need 0 <= m <= E and 1 <= k <= E, got E={experts}, m={held}, k={topk}"
        )
    out = 1.0
    for i in range(topk):
        out *= max(0.0, (experts - held - i) / (experts - i))
    return out


def flex_dispatch_time(
    p: int,
    local: int,
    row_bytes: float,
    rank_share: float,
    node_share: float,
    intra: Link,
    inter: Link,
) -> float:
    """One dispatch (or combine) of Megatron-core's flex dispatcher (DeepEP, HybridEP) over ``p``
    expert-parallel ranks, ``g = local`` of them on each node, ``N = p/g`` nodes: each rank's
    tokens go once to each rank holding one of their experts (``q_r = rank_share``: the chance a
    token touches a given rank), not once per expert (``docs/cost-model.md`` §10).

    Inside one node, or across nodes joined by a link not at least twice slower than the node's
    own (an NVLink domain of several trays, where HybridEP sends directly):

        max((g − 1)·α₀ + R·(g − 1)·q_r·β₀,  (p − g)·α + R·(p − g)·q_r·β)

    (``g = p``: the first term only). Across a network hop (``β ≥ 2·β₀``) a token crosses it once
    per node holding one of its experts (``q_n = node_share``), to the rank of the same local
    index, which forwards it over the node's own link to the node's ranks that need it:

        max((g − 1)·α₀ + R·N·(g − 1)·q_r·β₀,  (N − 1)·α + R·(N − 1)·q_n·β)

    ``R = row_bytes``, one copy of the rank's tokens. Both are at most
    :func:`hierarchical_alltoall_time` of the ``k`` copies (``q_r ≤ k/p``, ``q_n ≤ k/N``; the
    forwarded bytes ``R·k·(g − 1)/g·β₀`` stay below the AlltoAll's off-node ``R·k·(N − 1)/N·β``
    when ``β ≥ 2·β₀``). The combine sums the experts' outputs back along the same path.

    Parameters
    ----------
    p, local
        Ranks, and ranks per node (``1 ≤ g ≤ p``).
    row_bytes
        ``R``, bytes of one copy of the rank's dispatched tokens.
    rank_share, node_share
        ``q_r`` and ``q_n`` (:func:`untouched_share`: ``1 −`` the chance of missing the rank's
        ``E/p`` or the node's ``E·g/p`` experts).
    intra, inter
        ``(α, β)`` inside a node and at the tier the group spans.

    Returns
    -------
    float
        Seconds.
    """
    _check(p, row_bytes, local, "flex_dispatch_time")
    if p == 1:
        return 0.0
    g = local
    if g == p:
        return (p - 1) * intra.alpha + row_bytes * (p - 1) * rank_share * intra.beta
    if inter.beta < 2.0 * intra.beta:
        near = (g - 1) * intra.alpha + row_bytes * (g - 1) * rank_share * intra.beta
        far = (p - g) * inter.alpha + row_bytes * (p - g) * rank_share * inter.beta
        return max(near, far)
    nodes = p / g
    near = (g - 1) * intra.alpha + row_bytes * nodes * (g - 1) * rank_share * intra.beta
    far = (nodes - 1) * inter.alpha + row_bytes * (nodes - 1) * node_share * inter.beta
    return max(near, far)


def p2p_time(nbytes: float, link: Link) -> float:
    """Point-to-point send/receive: ``α + M·β`` (SPEC §6).

    Parameters
    ----------
    nbytes
        ``M``, bytes transferred.
    link
        ``(α, β)`` of point-to-point transfers at the tier the two ends span.

    Returns
    -------
    float
        Seconds.
    """
    _check(1, nbytes)
    return link.alpha + nbytes * link.beta
