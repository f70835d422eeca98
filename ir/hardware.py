"""Hardware description: the figures the cost model reads, as data (an input, SPEC §2).

A :class:`Hardware` holds GPU memory ``M_GPU``, effective compute ``F_peak``, HBM bandwidth
``BW_mem``, the GEMM-shape constants ``γM, γK``, the non-GEMM constant ``c_ng`` at batch ``B_cal``
and ``(α, β)`` pairs for collectives and point-to-point transfers at three tiers (SPEC §2):

* tier 0 — inside a node (NVLink/NVSwitch),
* tier 1 — between nodes of one rack,
* tier 2 — between racks.

Bundled presets live as JSON files in ``costmodel/presets/`` (nominal vendor figures,
derated); calibration writes the same format (see :meth:`Hardware.save`).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from .errors import InputError, Strict, read_json, validate

__all__ = ["TIER_NAMES", "Hardware", "Link"]

TIER_NAMES = ("intra-node", "inter-node", "inter-rack")


def _is_number(value: object) -> bool:
    """A finite int or float (``bool`` is not a number here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Link:
    """Latency/bandwidth pair of the α–β model: a transfer of ``M`` bytes takes ``α + M·β``.

    Parameters
    ----------
    alpha
        Start-up latency in seconds.
    beta
        Seconds per byte (the inverse of the bandwidth).
    """

    alpha: float
    beta: float

    def __post_init__(self) -> None:
        ok = all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0.0
            for v in (self.alpha, self.beta)
        )
        if not ok:
            raise ValueError(
                f"Link alpha and beta must be non-negative, got alpha={self.alpha!r}, beta={self.beta!r}"
            )


@dataclass(frozen=True)
class Hardware:
    """Per-GPU and interconnect figures of one cluster type.

    Parameters
    ----------
    name
        Preset or file name.
    gpu_memory_bytes
        ``M_GPU``, bytes of device memory per GPU.
    peak_flops
        ``F_peak``, dense BF16 FLOP/s per GPU the GEMMs can reach (already derated).
    mem_bandwidth
        ``BW_mem``, HBM bytes/s per GPU.
    gamma_m, gamma_k
        GEMM-shape constants of ``η = (b·ℓ/(b·ℓ + γM))·(k/(k + γK))``.
    c_nongemm
        ``c_ng``, seconds of non-GEMM work (norms, softmax, elementwise) per layer at batch
        ``b_cal`` sequences, at the reference sequence length folded into the constant.
    b_cal
        ``B_cal``, the batch at which ``c_nongemm`` was measured.
    collective
        ``(α, β)`` of collectives at tiers 0, 1, 2.
    p2p
        ``(α, β)`` of point-to-point transfers at tiers 0, 1, 2.
    memory_headroom
        ``ε``; usable memory is ``M_eff = (1 − ε)·M_GPU``.
    gpus_per_node
        The node size this hardware ships in (a default for cluster shapes).
    """

    name: str
    gpu_memory_bytes: float
    peak_flops: float
    mem_bandwidth: float
    gamma_m: float
    gamma_k: float
    c_nongemm: float
    b_cal: float
    collective: tuple[Link, Link, Link]
    p2p: tuple[Link, Link, Link]
    memory_headroom: float = 0.10
    gpus_per_node: int = 8
    notes: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for name in ("gpu_memory_bytes", "peak_flops", "mem_bandwidth", "b_cal"):
            value = getattr(self, name)
            if not (_is_number(value) and value > 0):
                raise ValueError(f"Hardware {self.name!r}: {name} must be positive, got {value!r}")
        for name in ("gamma_m", "gamma_k", "c_nongemm"):
            value = getattr(self, name)
            if not (_is_number(value) and value >= 0):
                raise ValueError(f"Hardware {self.name!r}: {name} must be non-negative, got {value!r}")
        if not (_is_number(self.memory_headroom) and 0.0 <= self.memory_headroom < 1.0):
            raise ValueError(
                f"Hardware {self.name!r}: memory_headroom must be in [0, 1), got {self.memory_headroom!r}"
            )
        for name in ("collective", "p2p"):
            links = getattr(self, name)
            if len(links) != 3:
                raise ValueError(f"Hardware {self.name!r}: {name} needs 3 tiers, got {len(links)}")
            object.__setattr__(self, name, tuple(lk if isinstance(lk, Link) else Link(*lk) for lk in links))

    @property
    def m_eff(self) -> float:
        """Usable memory per GPU, ``M_eff = (1 − ε)·M_GPU`` (SPEC §6)."""
        return (1.0 - self.memory_headroom) * self.gpu_memory_bytes

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, object]:
        """JSON-ready form; the inverse of :meth:`from_dict`."""
        d = asdict(self)
        d["format"] = "rpeg.hardware/1"
        d["collective"] = [{"tier": TIER_NAMES[i], **asdict(lk)} for i, lk in enumerate(self.collective)]
        d["p2p"] = [{"tier": TIER_NAMES[i], **asdict(lk)} for i, lk in enumerate(self.p2p)]
        return d

    @classmethod
    def from_dict(cls, data: object, source: str = "<dict>") -> Hardware:
        """Build from the form :meth:`to_dict` writes, strictly (:class:`_HardwareFile`).

        Raises
        ------
        InputError
            If a field is missing, unknown, of the wrong type (a string where a number belongs)
            or out of range (a negative bandwidth); the message names ``source``, the tier and
            the field.
        """
        doc = validate(_HardwareFile, data, source)
        try:
            return cls(
                name=doc.name,
                gpu_memory_bytes=doc.gpu_memory_bytes,
                peak_flops=doc.peak_flops,
                mem_bandwidth=doc.mem_bandwidth,
                gamma_m=doc.gamma_m,
                gamma_k=doc.gamma_k,
                c_nongemm=doc.c_nongemm,
                b_cal=doc.b_cal,
                collective=tuple(Link(lk.alpha, lk.beta) for lk in doc.collective),  # type: ignore[arg-type]
                p2p=tuple(Link(lk.alpha, lk.beta) for lk in doc.p2p),  # type: ignore[arg-type]
                memory_headroom=doc.memory_headroom,
                gpus_per_node=doc.gpus_per_node,
                notes=doc.notes,
            )
        except ValueError as exc:
            raise InputError(f"{source}: {exc}", source=source) from None

    def save(self, path: str | Path) -> None:
        """Write the JSON form to ``path``."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Hardware:
        """Read a hardware JSON file written by :meth:`save` or by calibration.

        Raises
        ------
        InputError
            If the file is missing, not JSON, or fails :meth:`from_dict`'s checks.
        """
        return cls.from_dict(read_json(path, "hardware file"), source=str(path))


# ---------------------------------------------------------------------------- the JSON file
Positive = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]


class _LinkEntry(Strict):
    tier: Literal["intra-node", "inter-node", "inter-rack"] | None = None
    alpha: NonNegative
    beta: NonNegative


def _in_tier_order(links: list[_LinkEntry]) -> list[_LinkEntry]:
    for i, lk in enumerate(links):
        if lk.tier is not None and lk.tier != TIER_NAMES[i]:
            raise ValueError(f"entry {i} must be tier {TIER_NAMES[i]!r}, got {lk.tier!r}")
    return links


Tiers = Annotated[list[_LinkEntry], Field(min_length=3, max_length=3), AfterValidator(_in_tier_order)]


class _HardwareFile(Strict):
    """Schema of ``rpeg.hardware/1``: every figure a finite number of the right sign."""

    format: Literal["rpeg.hardware/1"] = "rpeg.hardware/1"
    name: Annotated[str, Field(min_length=1)]
    gpu_memory_bytes: Positive
    peak_flops: Positive
    mem_bandwidth: Positive
    gamma_m: NonNegative
    gamma_k: NonNegative
    c_nongemm: NonNegative
    b_cal: Positive
    collective: Tiers
    p2p: Tiers
    memory_headroom: Annotated[float, Field(ge=0, lt=1)] = 0.10
    gpus_per_node: Annotated[int, Field(ge=1, le=1024)] = 8
    notes: str = ""
