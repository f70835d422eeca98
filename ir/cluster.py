"""The device space: racks × nodes × GPUs, aligned allocations, flat ids and link tiers.

Devices are addressed by ``(r, n, g)`` with flat id ``((r·Nn) + n)·Ng + g`` (SPEC §2). An
allocation ``D(o, δ)`` is a contiguous hyper-rectangle with origin ``o`` and extent ``δ``; it is
*aligned* when each origin coordinate is a multiple of the extent in that dimension (P7), so
allocations of one shape tile the device space. Legal shapes (P6, see ``docs/decisions.md``):

* part of one node: ``(1, 1, e)`` with ``e | Ng``;
* whole nodes inside one rack: ``(1, k, Ng)`` with ``k | Nn``;
* whole racks: ``(k, Nn, Ng)`` with ``k | Nr``.

A set of devices is represented as an ``int`` bit mask (bit ``i`` = flat id ``i``), which makes
overlap and union tests single integer operations in the evaluator.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property

from .hardware import Hardware

__all__ = [
    "MAX_DEVICES",
    "NO_SPLITS",
    "PARALLELISM_SWITCHES",
    "TIER_CLUSTER",
    "TIER_NODE",
    "TIER_RACK",
    "Allocation",
    "Cluster",
    "mask_devices",
    "mask_range",
    "parse_shape",
    "pool_cluster",
]

TIER_NODE = 0  # all devices inside one node
TIER_RACK = 1  # several nodes inside one rack
TIER_CLUSTER = 2  # several racks


@dataclass(frozen=True)
class Allocation:
    """An aligned hyper-rectangle ``D(o, δ)`` of the device space.

    Parameters
    ----------
    origin
        ``(r, n, g)`` of its first device.
    extent
        ``(dr, dn, dg)``, its size in racks, nodes and GPUs.
    mask
        Bit mask of its flat device ids.
    tier
        Slowest link tier it spans (0 node, 1 rack, 2 cluster).
    """

    origin: tuple[int, int, int]
    extent: tuple[int, int, int]
    mask: int
    tier: int

    @property
    def size(self) -> int:
        """Number of devices ``|σ| = dr·dn·dg``."""
        return self.extent[0] * self.extent[1] * self.extent[2]

    def devices(self) -> list[int]:
        """Flat device ids in rank order (GPU fastest, then node, then rack)."""
        return mask_devices(self.mask)


def mask_devices(mask: int) -> list[int]:
    """Flat ids of the set bits of ``mask``, ascending.

    A contiguous run of ids (every legal allocation is one: a part of a node, whole nodes of a
    rack or whole racks) is read in one step from its lowest bit and its bit count; other masks
    bit by bit.
    """
    run = mask_range(mask)
    if run is not None:
        return list(run)
    out = []
    i = 0
    while mask:
        if mask & 1:
            out.append(i)
        mask >>= 1
        i += 1
    return out


def mask_range(mask: int) -> range | None:
    """The flat ids of ``mask`` as ``range(lo, lo + k)`` when they are one contiguous run
    (``mask = (2^k − 1)·2^lo``), else ``None``."""
    if mask <= 0:
        return None
    low = (mask & -mask).bit_length() - 1
    size = mask.bit_count()
    return range(low, low + size) if mask == ((1 << size) - 1) << low else None


def _is_int(value: object) -> bool:
    """An integer of any kind (NumPy's included), never a ``bool``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


#: Largest cluster rpeg plans for (device sets are bit masks; 64 K GPUs is beyond any job's size).
MAX_DEVICES = 65_536

_SHAPE_RE = re.compile(r"^\s*(\d+)\s*[x×*,]\s*(\d+)\s*[x×*,]\s*(\d+)\s*$")


def parse_shape(shape: str) -> tuple[int, int, int]:
    """``"RxNxG"`` → ``(R, N, G)``, each a positive integer, at most :data:`MAX_DEVICES` GPUs.

    Raises
    ------
    ValueError
        If the text is not three positive integers joined by ``x`` or the cluster is too large.
    """
    m = _SHAPE_RE.match(shape) if isinstance(shape, str) else None
    if not m:
        raise ValueError(f"cluster shape must look like RACKSxNODESxGPUS (e.g. 1x2x4), got {shape!r}")
    r, n, g = (int(x) for x in m.groups())
    if min(r, n, g) < 1:
        raise ValueError(f"cluster shape {shape!r}: racks, nodes and GPUs must each be at least 1")
    if r * n * g > MAX_DEVICES:
        raise ValueError(
            f"cluster shape {shape!r} has {r * n * g:,} GPUs; at most {MAX_DEVICES:,} are supported"
        )
    return r, n, g


#: The engine switches of :class:`Cluster` for SPEC §15's parallelisms (rules S1, C1, E1), the
#: interleaved pipeline (rule V1), the overlapped expert-parallel AlltoAlls (rule E5) and the
#: flex dispatcher (rule E6).
PARALLELISM_SWITCHES = (
    "sequence_parallel",
    "context_parallel",
    "expert_parallel",
    "virtual_pipeline_parallel",
    "expert_overlap",
    "flex_dispatch",
)
#: Every SPEC §15 switch off, as keyword arguments of :class:`Cluster`: the plan space of engines
#: that run none of them (the bundled torch engine; ``Cluster.from_shape(..., **NO_SPLITS)``).
NO_SPLITS: dict[str, bool] = dict.fromkeys(PARALLELISM_SWITCHES, False)


@dataclass(frozen=True)
class Cluster:
    """A homogeneous GPU cluster of ``racks × nodes_per_rack × gpus_per_node`` devices.

    Parameters
    ----------
    racks, nodes_per_rack, gpus_per_node
        ``Nr, Nn, Ng``.
    hardware
        Per-GPU and link figures (:class:`~rpeg.ir.hardware.Hardware`).
    generation_max_pp
        The largest pipeline degree the rollout engine can run for generation (rule P9 of
        :func:`~rpeg.ir.plan.check_strategy`); ``None``: no limit (vLLM on GPUs). ``1`` plans for
        vLLM's CPU build, which has no pipeline parallelism (``rpeg solve --generation-max-pp 1``).
    max_zero_stage
        The largest ZeRO stage the training and inference engines run (rule Z3 of
        :func:`~rpeg.ir.plan.check_strategy`, SPEC §14.3); ``None``: 3 (FSDP2, Megatron-core).
        ``2`` plans for the bundled torch engine, which keeps full parameters between updates
        (``rpeg solve --max-zero-stage 2``).
    host_offload
        Whether the engines can keep an invocation's persistent state in host memory between
        its runs (rule Z4, SPEC §14.4: verl's parameter and optimizer offload, vLLM's sleep
        mode); default ``True`` (both do on GPUs). ``False`` plans for the bundled CPU engines,
        whose host and device memory are one (``rpeg solve --no-host-offload``).
    sequence_parallel, context_parallel, expert_parallel
        Whether the training and inference engines split the non-tensor-parallel regions over the
        TP ranks (Megatron's sequence parallelism), split sequences over ranks (ring or Ulysses
        context parallelism) and shard a mixture of experts' routed experts over ranks (expert
        parallelism; for generation, vLLM's experts over the engine's ranks with data-parallel
        attention) — rules S1, C1 and E1 of :func:`~rpeg.ir.plan.check_strategy`, SPEC §15.2–15.3.
        Default ``True`` (Megatron-core and vLLM do on GPUs). ``False`` plans without it: for the
        bundled torch engine, which runs none of them (``rpeg solve --no-sequence-parallel
        --no-context-parallel --no-expert-parallel``), or to compare with the best plan without.
    virtual_pipeline_parallel
        Whether the training and inference engines interleave the pipeline, ``vp`` model chunks
        per stage (Megatron-core's virtual pipeline, rule V1 of
        :func:`~rpeg.ir.plan.check_strategy`); default ``True`` (Megatron-core does). ``False``
        for the bundled torch engine (``rpeg solve --no-virtual-pipeline-parallel``).
    expert_overlap
        Whether the training engine overlaps the expert-parallel AlltoAlls of one microbatch
        with another microbatch's compute (Megatron-core's ``overlap_moe_expert_parallel_comm``,
        rule E5 of :func:`~rpeg.ir.plan.check_strategy`); default ``True`` (Megatron-core does).
        ``False`` for the bundled torch engine, which runs them in line (``rpeg solve
        --no-expert-overlap``), or to compare with the best plan without.
    flex_dispatch
        Whether the training and inference engine dispatches tokens to the experts with
        Megatron-core's flex dispatcher (DeepEP or HybridEP: each token once per rank, across
        nodes once per node; rule E6 of :func:`~rpeg.ir.plan.check_strategy`); default ``True``
        (Megatron-core has it with DeepEP or HybridEP installed; NVIDIA's MoE recipes use it).
        ``False`` for engines with the AlltoAll dispatcher only — the bundled torch engine
        (``rpeg solve --no-flex-dispatch``).

    Raises
    ------
    ValueError
        If a dimension or ``generation_max_pp`` is not a positive integer, or
        ``max_zero_stage`` is not 1, 2, 3 or ``None``, or ``host_offload`` or a parallelism switch
        is not a boolean (the message names it).
    """

    racks: int
    nodes_per_rack: int
    gpus_per_node: int
    hardware: Hardware
    generation_max_pp: int | None = None
    max_zero_stage: int | None = None
    host_offload: bool = True
    sequence_parallel: bool = True
    context_parallel: bool = True
    expert_parallel: bool = True
    virtual_pipeline_parallel: bool = True
    expert_overlap: bool = True
    flex_dispatch: bool = True

    def __post_init__(self) -> None:
        for name in ("racks", "nodes_per_rack", "gpus_per_node"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ValueError(f"Cluster: {name} must be a positive integer, got {value!r}")
            object.__setattr__(self, name, int(value))  # a NumPy integer stored as an int
        if self.racks * self.nodes_per_rack * self.gpus_per_node > MAX_DEVICES:
            raise ValueError(
                f"Cluster: {self.racks}x{self.nodes_per_rack}x{self.gpus_per_node} has "
                f"{self.racks * self.nodes_per_rack * self.gpus_per_node:,} GPUs; at most {MAX_DEVICES:,} are supported"
            )
        g = self.generation_max_pp
        if g is not None and (not _is_int(g) or g < 1):
            raise ValueError(f"Cluster: generation_max_pp must be a positive integer or None, got {g!r}")
        z = self.max_zero_stage
        if z is not None and (not _is_int(z) or z not in (1, 2, 3)):
            raise ValueError(f"Cluster: max_zero_stage must be 1, 2, 3 or None, got {z!r}")
        for name, value in (("generation_max_pp", g), ("max_zero_stage", z)):
            if value is not None:
                object.__setattr__(self, name, int(value))
        for name in ("host_offload", *PARALLELISM_SWITCHES):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Cluster: {name} must be True or False, got {getattr(self, name)!r}")
        if not isinstance(self.hardware, Hardware):
            raise TypeError(f"Cluster: hardware must be a Hardware, got {type(self.hardware).__name__}")

    @classmethod
    def from_shape(
        cls,
        shape: str | tuple[int, int, int],
        hardware: Hardware,
        *,
        generation_max_pp: int | None = None,
        max_zero_stage: int | None = None,
        host_offload: bool = True,
        sequence_parallel: bool = True,
        context_parallel: bool = True,
        expert_parallel: bool = True,
        virtual_pipeline_parallel: bool = True,
        expert_overlap: bool = True,
        flex_dispatch: bool = True,
    ) -> Cluster:
        """Build from ``"RxNxG"`` (e.g. ``"2x8x4"``) or a ``(R, N, G)`` tuple (or list).

        Raises
        ------
        TypeError
            If ``shape`` is neither a string nor a tuple or list (``16``, ``None``).
        ValueError
            If the shape string is malformed, a tuple does not have three entries
            (``(1, 4)``), or an entry is not a positive integer; the message names ``shape``.
        """
        form = "'RACKSxNODESxGPUS' (e.g. '1x2x4') or a (racks, nodes_per_rack, gpus_per_node) tuple"
        if isinstance(shape, str):
            r, n, g = parse_shape(shape)
        elif isinstance(shape, Sequence) and not isinstance(shape, (bytes, bytearray)):
            if len(shape) != 3:
                raise ValueError(
                    f"Cluster.from_shape: shape must be {form}; got {len(shape)} entries {shape!r}"
                )
            bad = [x for x in shape if not _is_int(x) or x < 1]
            if bad:
                raise ValueError(
                    f"Cluster.from_shape: shape {tuple(shape)!r} must hold three positive integers "
                    f"(racks, nodes_per_rack, gpus_per_node); {bad[0]!r} is not one"
                )
            r, n, g = shape
        else:
            raise TypeError(f"Cluster.from_shape: shape must be {form}, got {type(shape).__name__} {shape!r}")
        return cls(
            r,
            n,
            g,
            hardware,
            generation_max_pp,
            max_zero_stage,
            host_offload,
            sequence_parallel,
            context_parallel,
            expert_parallel,
            virtual_pipeline_parallel,
            expert_overlap,
            flex_dispatch,
        )

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(Nr, Nn, Ng)``."""
        return (self.racks, self.nodes_per_rack, self.gpus_per_node)

    @property
    def shape_str(self) -> str:
        """``"RxNxG"``."""
        return f"{self.racks}x{self.nodes_per_rack}x{self.gpus_per_node}"

    @property
    def num_devices(self) -> int:
        """``|D| = Nr·Nn·Ng``."""
        return self.racks * self.nodes_per_rack * self.gpus_per_node

    @property
    def all_mask(self) -> int:
        """Mask of every device."""
        return (1 << self.num_devices) - 1

    def flat_id(self, r: int, n: int, g: int) -> int:
        """``((r·Nn) + n)·Ng + g``."""
        return (r * self.nodes_per_rack + n) * self.gpus_per_node + g

    def coords(self, flat: int) -> tuple[int, int, int]:
        """Inverse of :meth:`flat_id`."""
        node, g = divmod(flat, self.gpus_per_node)
        r, n = divmod(node, self.nodes_per_rack)
        return (r, n, g)

    # ------------------------------------------------------------------ tiers
    def tier_of_mask(self, mask: int) -> int:
        """Slowest tier spanned by the devices of ``mask``: 0 if all in one node, 1 if all in one
        rack, else 2. An empty or single-device mask is tier 0."""
        if mask & (mask - 1) == 0:
            return TIER_NODE
        lo = (mask & -mask).bit_length() - 1
        hi = mask.bit_length() - 1
        node_lo, node_hi = lo // self.gpus_per_node, hi // self.gpus_per_node
        if node_lo == node_hi:
            return TIER_NODE
        if node_lo // self.nodes_per_rack == node_hi // self.nodes_per_rack:
            return TIER_RACK
        return TIER_CLUSTER

    # ------------------------------------------------------------------ allocations
    def shape_for_size(self, size: int) -> tuple[int, int, int] | None:
        """The legal allocation extent with ``size`` devices, or ``None`` if there is none.

        ``size ≤ Ng`` needs ``size | Ng``; larger sizes need whole nodes: ``size = k·Ng`` with
        ``k | Nn`` (one rack) or ``k = j·Nn`` with ``j | Nr`` (whole racks).
        """
        Ng, Nn, Nr = self.gpus_per_node, self.nodes_per_rack, self.racks
        if size < 1:
            return None
        if size <= Ng:
            return (1, 1, size) if Ng % size == 0 else None
        if size % Ng:
            return None
        k = size // Ng
        if k <= Nn:
            return (1, k, Ng) if Nn % k == 0 else None
        if k % Nn:
            return None
        j = k // Nn
        return (j, Nn, Ng) if j <= Nr and Nr % j == 0 else None

    @cached_property
    def legal_sizes(self) -> tuple[int, ...]:
        """All allocation sizes with a legal shape, ascending."""
        return tuple(s for s in range(1, self.num_devices + 1) if self.shape_for_size(s) is not None)

    def allocation(self, origin: tuple[int, int, int], extent: tuple[int, int, int]) -> Allocation:
        """Validate and build ``D(origin, extent)``.

        Raises
        ------
        ValueError
            If the extent is not a legal shape, the origin is not aligned to the extent (P7), or
            the rectangle leaves the device space; the message names the field and value.
        """
        origin = tuple(int(x) for x in origin)  # type: ignore[assignment]
        extent = tuple(int(x) for x in extent)  # type: ignore[assignment]
        if len(origin) != 3 or len(extent) != 3:
            raise ValueError(f"allocation origin and extent need 3 coordinates, got {origin!r}, {extent!r}")
        size = extent[0] * extent[1] * extent[2]
        if min(extent) < 1 or self.shape_for_size(size) != extent:
            raise ValueError(
                f"allocation extent {list(extent)} is not a legal shape on cluster {self.shape_str} "
                f"(legal shape for {size} devices: {self.shape_for_size(size)})"
            )
        for dim, (o, e, lim) in enumerate(zip(origin, extent, self.shape)):
            name = ("rack", "node", "gpu")[dim]
            if o < 0 or o + e > lim:
                raise ValueError(
                    f"allocation origin {list(origin)} with extent {list(extent)} leaves the cluster "
                    f"{self.shape_str} in the {name} dimension"
                )
            if o % e:
                raise ValueError(
                    f"allocation origin {list(origin)} is not aligned to extent {list(extent)} in the "
                    f"{name} dimension (P7)"
                )
        return self._make(origin, extent)  # type: ignore[arg-type]

    def _make(self, origin: tuple[int, int, int], extent: tuple[int, int, int]) -> Allocation:
        Ng, Nn = self.gpus_per_node, self.nodes_per_rack
        mask = 0
        for r in range(origin[0], origin[0] + extent[0]):
            for n in range(origin[1], origin[1] + extent[1]):
                base = (r * Nn + n) * Ng
                mask |= ((1 << extent[2]) - 1) << (base + origin[2])
        return Allocation(origin, extent, mask, self.tier_of_mask(mask))

    def allocations_of_size(self, size: int) -> list[Allocation]:
        """Every aligned allocation with ``size`` devices, in flat-id order of their origins."""
        extent = self.shape_for_size(size)
        if extent is None:
            return []
        out = []
        for r in range(0, self.racks, extent[0]):
            for n in range(0, self.nodes_per_rack, extent[1]):
                for g in range(0, self.gpus_per_node, extent[2]):
                    out.append(self._make((r, n, g), extent))
        return out

    def to_dict(self) -> dict[str, object]:
        """The ``cluster`` block of a result file (SPEC §12)."""
        hw = self.hardware.to_dict()  # with its format: rpeg.hardware/1 blocks are refused on reading
        return {
            "racks": self.racks,
            "nodes_per_rack": self.nodes_per_rack,
            "gpus_per_node": self.gpus_per_node,
            "gpu_memory_bytes": self.hardware.gpu_memory_bytes,
            "memory_headroom": self.hardware.memory_headroom,
            "hardware": hw,
            **({"generation_max_pp": self.generation_max_pp} if self.generation_max_pp is not None else {}),
            **({"max_zero_stage": self.max_zero_stage} if self.max_zero_stage is not None else {}),
            **({} if self.host_offload else {"host_offload": False}),
            **{name: False for name in PARALLELISM_SWITCHES if not getattr(self, name)},
        }


def pool_cluster(full: Cluster, devices: int) -> Cluster:
    """The cluster of a pool of the first ``devices`` flat ids of ``full``.

    Flat ids keep their meaning (``((r·Nn) + n)·Ng + g``): a pool is one partial node
    ``(1, 1, n)``, whole nodes of one rack ``(1, n/Ng, Ng)`` or whole racks ``(n/(Nn·Ng), Nn, Ng)``.

    Raises
    ------
    ValueError
        If ``devices`` is not in ``1..|D|`` or is not one of those shapes.
    """
    Ng, Nn = full.gpus_per_node, full.nodes_per_rack
    if isinstance(devices, bool) or not isinstance(devices, int) or not 1 <= devices <= full.num_devices:
        raise ValueError(f"pool: devices must be an integer in 1..{full.num_devices}, got {devices!r}")
    if devices <= Ng:
        shape = (1, 1, devices)
    elif devices % Ng == 0 and devices // Ng <= Nn:
        shape = (1, devices // Ng, Ng)
    elif devices % (Nn * Ng) == 0:
        shape = (devices // (Nn * Ng), Nn, Ng)
    else:
        raise ValueError(
            f"pool: {devices} devices are neither part of a node, whole nodes of one rack nor whole "
            f"racks of cluster {full.shape_str}"
        )
    return replace(
        Cluster.from_shape(shape, full.hardware),
        generation_max_pp=full.generation_max_pp,
        max_zero_stage=full.max_zero_stage,
        host_offload=full.host_offload,
        **{name: getattr(full, name) for name in PARALLELISM_SWITCHES},
    )
