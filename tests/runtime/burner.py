"""A CPU burner: plain busy-looping processes that load the machine while runtime scenarios
run (``cpu_burner`` fixture in ``tests/runtime/conftest.py``)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

#: Busy-looping processes the burner starts (a load of about this many on top of the tests').
BURNERS = 6
#: A burner stops by itself after this long, or as soon as its parent (the test process) is gone,
#: so a killed test run never leaves it spinning.
BURNER_LIFETIME_S = 900

_LOOP = f"""
import os, time
parent, end = os.getppid(), time.monotonic() + {BURNER_LIFETIME_S}
while os.getppid() == parent and time.monotonic() < end:
    for _ in range(200_000):
        pass
"""


@dataclass
class Burner:
    """Running burner processes; :meth:`load` reads the 1-minute load average."""

    procs: list[subprocess.Popen] = field(default_factory=list)
    started: float = 0.0

    def alive(self) -> int:
        """Burner processes still running."""
        return sum(p.poll() is None for p in self.procs)

    @staticmethod
    def load() -> float:
        """The 1-minute load average."""
        return os.getloadavg()[0]

    def stop(self) -> None:
        """Kill every burner and reap it (idempotent)."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):  # SIGKILL does not wait
                p.wait(timeout=30)


def start_burner(n: int = BURNERS) -> Burner:
    """Start ``n`` plain busy-looping Python processes (not niced: they compete for the CPU with
    the workers exactly as other users' jobs would)."""
    b = Burner(started=time.monotonic())
    for _ in range(n):
        b.procs.append(
            subprocess.Popen(
                [sys.executable, "-c", _LOOP], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
            )
        )
    return b
