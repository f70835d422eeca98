"""A warm-up whose ``run`` waits for the test (tests/ir/test_warmup.py): it writes
``started-<pid>`` into ``$RPEG_PROBE_DIR``, waits for the file ``go`` there, then writes
``done-<pid>``. Imported by a child process and by the detached process that finishes it."""

from __future__ import annotations

import os
import time
from pathlib import Path

from rpeg.ir.warmup import WarmUp


def wait_for_go() -> bool:
    """The probe's kernels: ``started-<pid>``, wait for ``go`` (at most 10 minutes), ``done-<pid>``."""
    d = Path(os.environ["RPEG_PROBE_DIR"])
    (d / f"started-{os.getpid()}").touch()
    for _ in range(6000):
        if (d / "go").exists():
            (d / f"done-{os.getpid()}").touch()
            return True
        time.sleep(0.1)
    return False


WARM_UP = WarmUp("rpeg-test-probe", wait_for_go, "the probe's kernels", "the reference")
