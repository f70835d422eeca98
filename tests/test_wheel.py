"""The package as a user installs it: ``.ci/check-wheel`` builds the wheel from a copy of the
tree, installs it (not editable) into a fresh venv and runs ``rpeg`` from outside the checkout —
every module imports, ``rpeg examples`` and ``rpeg solve`` with each method work. A module, data
file or dependency the wheel lacks fails here (the 0.1.0 wheel lacked ``rpeg.heuristics.search``).

It takes about 45 s (mostly installing the dependencies), so it runs last (``conftest.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_wheel_installs_and_runs_outside_the_checkout():
    # the interpreter the test venv was made from: the fresh venv starts from the same Python
    env = dict(os.environ, PYTHON=getattr(sys, "_base_executable", sys.executable))
    done = subprocess.run(
        ["bash", str(ROOT / ".ci" / "check-wheel")],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    log = done.stdout
    assert done.returncode == 0, f".ci/check-wheel failed (exit {done.returncode}):\n{log[-6000:]}"
    assert "check-wheel: passed" in log
    assert "site-packages/rpeg/__init__.py" in log  # imported from the wheel, not the checkout
