"""Bundled example workloads: the TOML files in this folder (``rpeg examples`` lists them)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["example_names", "example_path"]

_DIR = Path(__file__).parent


def example_names() -> list[str]:
    """Names of the bundled examples (file stems), sorted."""
    return sorted(p.stem for p in _DIR.glob("*.toml"))


def example_path(name: str) -> Path:
    """Path of the bundled example ``name``.

    Raises
    ------
    ValueError
        For an unknown name, listing the known ones.
    """
    path = _DIR / f"{name}.toml"
    if not path.is_file():
        raise ValueError(f"unknown example {name!r}; bundled examples: {', '.join(example_names())}")
    return path
