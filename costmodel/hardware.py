"""Bundled hardware presets (JSON data in ``presets/``) and how to load one.

A preset is nominal vendor figures derated to what dense BF16 GEMMs and NCCL collectives reach
in practice; calibration (SPEC §6) replaces them with measurements in the same file format.
"""

from __future__ import annotations

from pathlib import Path

from ..ir.hardware import Hardware, Link

__all__ = ["HARDWARE_PRESETS", "Hardware", "Link", "hardware_preset", "load_hardware"]

_PRESET_DIR = Path(__file__).parent / "presets"


def _preset_names() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in _PRESET_DIR.glob("*.json")))


HARDWARE_PRESETS: tuple[str, ...] = _preset_names()


def hardware_preset(name: str) -> Hardware:
    """Load the bundled preset ``name`` (case-insensitive).

    Raises
    ------
    ValueError
        For an unknown preset, listing the known ones.
    """
    key = name.strip().lower()
    path = _PRESET_DIR / f"{key}.json"
    if not path.is_file():
        raise ValueError(f"unknown hardware preset {name!r}; known presets: {', '.join(HARDWARE_PRESETS)}")
    return Hardware.load(path)


def load_hardware(spec: str | Path | Hardware) -> Hardware:
    """Resolve a preset name, a JSON file path, or pass a :class:`Hardware` through."""
    if isinstance(spec, Hardware):
        return spec
    text = str(spec)
    if text.endswith(".json") or Path(text).is_file():
        return Hardware.load(text)
    return hardware_preset(text)
