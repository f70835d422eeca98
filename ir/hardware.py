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
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["TIER_NAMES", "Hardware", "Link"]

TIER_NAMES = ("intra-node", "inter-node", "inter-rack")


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
        if not (self.alpha >= 0.0 and self.beta >= 0.0):
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
            if not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"Hardware {self.name!r}: {name} must be positive, got {value!r}")
        for name in ("gamma_m", "gamma_k", "c_nongemm"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value >= 0):
                raise ValueError(f"Hardware {self.name!r}: {name} must be non-negative, got {value!r}")
        if not 0.0 <= self.memory_headroom < 1.0:
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
    def from_dict(cls, data: dict[str, object], source: str = "<dict>") -> Hardware:
        """Build from the form :meth:`to_dict` writes.

        Raises
        ------
        ValueError
            If a field is missing or malformed; the message names the field and ``source``.
        """
        required = (
            "name",
            "gpu_memory_bytes",
            "peak_flops",
            "mem_bandwidth",
            "gamma_m",
            "gamma_k",
            "c_nongemm",
            "b_cal",
            "collective",
            "p2p",
        )
        missing = [k for k in required if k not in data]
        if missing:
            raise ValueError(f"{source}: hardware description is missing field(s) {', '.join(missing)}")

        def links(key: str) -> tuple[Link, Link, Link]:
            raw = data[key]
            if not isinstance(raw, list) or len(raw) != 3:
                raise ValueError(f"{source}: field {key!r} must be a list of 3 tiers, got {raw!r}")
            out = []
            for i, item in enumerate(raw):
                try:
                    out.append(Link(float(item["alpha"]), float(item["beta"])))
                except (KeyError, TypeError) as exc:
                    raise ValueError(f"{source}: {key}[{i}] needs 'alpha' and 'beta', got {item!r}") from exc
            return tuple(out)  # type: ignore[return-value]

        return cls(
            name=str(data["name"]),
            gpu_memory_bytes=float(data["gpu_memory_bytes"]),
            peak_flops=float(data["peak_flops"]),
            mem_bandwidth=float(data["mem_bandwidth"]),
            gamma_m=float(data["gamma_m"]),
            gamma_k=float(data["gamma_k"]),
            c_nongemm=float(data["c_nongemm"]),
            b_cal=float(data["b_cal"]),
            collective=links("collective"),
            p2p=links("p2p"),
            memory_headroom=float(data.get("memory_headroom", 0.10)),
            gpus_per_node=int(data.get("gpus_per_node", 8)),
            notes=str(data.get("notes", "")),
        )

    def save(self, path: str | Path) -> None:
        """Write the JSON form to ``path``."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Hardware:
        """Read a hardware JSON file written by :meth:`save` or by calibration."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from exc
        return cls.from_dict(data, source=str(path))
