"""The floors hold (docs/architecture.md): the import-linter contracts in ``pyproject.toml`` pass
on the tree, and they do catch a back-arrow and a cycle when one is written.

``make test`` runs ``lint-imports`` too; this test keeps the check inside ``pytest`` and proves
the contracts are not vacuous: a copy of the tree with one upward import (``ir`` → ``solvers``)
and one sibling cycle (``ir.types`` ↔ ``ir.plan``) breaks both, naming the import; one where the
runtime's driver imports the worker and torch breaks the runtime's two (docs/runtime.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(
    not LINT.exists(), reason="import-linter is a dev extra (pip install -e '.[dev]')"
)


def lint(tree: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with the repository's contracts over the package whose parent is ``tree``."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    return subprocess.run(
        [str(LINT), "--no-cache", str(ROOT / "pyproject.toml")],
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def copy_package(dest: Path) -> Path:
    """The package's source files under ``dest/rpeg`` (no venv, no data, no caches)."""
    skip = shutil.ignore_patterns(
        ".venv",
        ".git",
        "build",
        "*.egg-info",
        "__pycache__",
        "data",
        "out",
        "*.png",
        ".*_cache",
        ".hypothesis",
    )
    shutil.copytree(ROOT, dest / "rpeg", ignore=skip)
    return dest / "rpeg"


def test_the_tree_keeps_the_floors_and_has_no_cycles(tmp_path):
    pkg = copy_package(tmp_path)
    done = lint(pkg.parent)
    assert done.returncode == 0, done.stdout[-4000:]
    assert "Contracts: 4 kept, 0 broken." in done.stdout


def test_a_back_arrow_and_a_cycle_are_caught(tmp_path):
    pkg = copy_package(tmp_path)
    with (pkg / "ir" / "workload.py").open("a") as f:
        f.write("\nfrom ..solvers import result as _upward  # noqa\n")
    with (pkg / "ir" / "types.py").open("a") as f:
        f.write("\nfrom . import plan as _cycle  # noqa\n")
    done = lint(pkg.parent)
    assert done.returncode != 0
    out = done.stdout
    assert "Floors: each imports only the floors below it BROKEN" in out, out[-4000:]
    assert (
        "rpeg.ir is not allowed to import rpeg.solvers" in out and "rpeg.ir.workload -> rpeg.solvers" in out
    )
    assert "No import cycles between sibling modules BROKEN" in out
    assert "No cycles are allowed in rpeg.ir." in out


def test_the_driver_importing_the_worker_or_torch_is_caught(tmp_path):
    pkg = copy_package(tmp_path)
    with (pkg / "runtime" / "driver" / "pool.py").open("a") as f:
        f.write("\nfrom ..worker import rl as _across  # noqa\n")  # torch, through the worker
    with (pkg / "runtime" / "driver" / "liveness.py").open("a") as f:
        f.write("\nimport torch as _torch  # noqa\n")
    out = lint(pkg.parent).stdout
    assert "the driver and the worker never import each other" in out and "BROKEN" in out, out[-4000:]
    assert "rpeg.runtime.driver.pool -> rpeg.runtime.worker.rl" in out
    assert "The driver never imports torch (directly or through anything it imports) BROKEN" in out
    assert "rpeg.runtime.driver.liveness -> torch" in out
