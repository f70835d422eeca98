"""Package discovery for the flat layout: the repository root *is* the package ``rpeg``.

setuptools' ``packages.find`` cannot map a root folder to a package name, so the subpackages
are discovered here instead of being listed by hand (a hand-kept list once left
``rpeg.heuristics.search`` out of the wheel): every folder with an ``__init__.py`` outside tests
and benchmarks, plus the data-only folders inside those packages (``costmodel/presets``), which
ship their ``*.json``/``*.toml`` files as package data.
"""

from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

_ROOT = Path(__file__).parent
_CODE = find_packages(where=str(_ROOT), exclude=["tests", "tests.*", "benchmarks", "benchmarks.*"])
_DATA_SUFFIXES = (".json", ".toml")
_DATA = sorted(
    ".".join(sub.relative_to(_ROOT).parts)
    for pkg in _CODE
    for sub in (_ROOT / pkg.replace(".", "/")).iterdir()
    if sub.is_dir()
    and not (sub / "__init__.py").exists()
    and any(f.suffix in _DATA_SUFFIXES for f in sub.iterdir())
)


class _BuildPy(build_py):
    """Leaves this file out of the wheel (it sits in the package's root folder)."""

    def find_package_modules(self, package: str, package_dir: str) -> list[tuple[str, str, str]]:
        modules = super().find_package_modules(package, package_dir)
        return [m for m in modules if (m[0], m[1]) != ("rpeg", "setup")]


setup(
    cmdclass={"build_py": _BuildPy},
    package_dir={"rpeg": "."},
    packages=["rpeg", *(f"rpeg.{name}" for name in (*_CODE, *_DATA))],
    package_data={"rpeg.examples": ["*.toml"], **{f"rpeg.{name}": ["*.json", "*.toml"] for name in _DATA}},
)
