"""The package as a user installs it: ``.ci/check-wheel`` builds the wheel from a copy of the
tree, installs it (not editable) into a fresh venv and runs ``rpeg`` from outside the checkout —
every module imports, ``rpeg examples`` and ``rpeg solve`` with each method work. A module, data
file or dependency the wheel lacks fails here (the 0.1.0 wheel lacked ``rpeg.heuristics.search``).

The script takes about 45 s (mostly installing the dependencies), so ``conftest.py`` starts it in
the background when this test is collected, beside the other tests of the session, and this test,
which runs last, waits for it.
"""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_the_wheel_installs_and_runs_outside_the_checkout(background_wheel_check):
    status, log = background_wheel_check.result()
    assert status == 0, f".ci/check-wheel failed (exit {status}):\n{log[-6000:]}"
    assert "check-wheel: passed" in log
    assert "site-packages/rpeg/__init__.py" in log  # imported from the wheel, not the checkout
