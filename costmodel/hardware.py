"""Bundled hardware presets (JSON data in ``presets/``) and how to load one.

A preset is nominal vendor figures derated to what dense BF16 GEMMs and NCCL collectives reach
in practice; calibration (SPEC §6) replaces them with measurements in the same file format.
"""

from __future__ import annotations

from pathlib import Path

from ..ir.errors import InputError
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
    if not isinstance(name, str):
        raise TypeError(f"hardware preset name must be a string, got {type(name).__name__} {name!r}")
    key = name.strip().lower()
    path = _PRESET_DIR / f"{key}.json"
    if not key or "/" in key or not path.is_file():
        raise ValueError(f"unknown hardware preset {name!r}; known presets: {', '.join(HARDWARE_PRESETS)}")
    return Hardware.load(path)


def load_hardware(spec: str | Path | Hardware) -> Hardware:
    """Resolve a preset name, a JSON file path, or pass a :class:`Hardware` through.

    A string ending in ``.json``, holding a path separator, or naming an existing file is read
    as a file (a missing one is an error, never a fallback to a preset).

    Raises
    ------
    InputError
        For a missing or malformed file (naming the file and the field) or an unknown preset.
    TypeError
        If ``spec`` is neither a string, a path nor a :class:`Hardware`.
    """
    if isinstance(spec, Hardware):
        return spec
    if not isinstance(spec, (str, Path)):
        raise TypeError(
            f"hardware must be a preset name, a JSON path or a Hardware, got {type(spec).__name__}"
        )
    text = str(spec)
    if isinstance(spec, Path) or text.endswith(".json") or "/" in text or Path(text).is_file():
        return Hardware.load(text)
    try:
        return hardware_preset(text)
    except ValueError as exc:
        raise InputError(str(exc), source=text) from None
