"""The package as a user installs it: ``.ci/check-wheel`` builds the wheel, installs it (not
editable) into a fresh venv and runs ``rpeg`` from outside the checkout — every module imports,
``rpeg examples`` and ``rpeg solve`` with each method work.

The script takes a minute or two (mostly installing the dependencies), so ``conftest.py`` starts
it in the background as soon as this test is collected and this test, which runs last, waits for
it; the rest of the suite runs meanwhile.
"""

from __future__ import annotations

import pytest

from tests.conftest import wheel_check


@pytest.mark.slow
def test_the_wheel_installs_and_runs_outside_the_checkout():
    check = wheel_check()
    status, log = check.result()
    assert status == 0, f".ci/check-wheel failed (exit {status}):\n{log[-6000:]}"
    assert "check-wheel: passed" in log
    assert "site-packages/rpeg/__init__.py" in log  # imported from the wheel, not the checkout
