"""``engine_output_to``: what the engines print goes to a file, rpeg's own lines to the terminal."""

from __future__ import annotations

import subprocess
import sys

_PROBE = """
import subprocess, sys
from rpeg.runtime.driver.engine_output import engine_output_to
print("before")
with engine_output_to(sys.argv[1]) as console:
    print("python stdout")
    print("python stderr", file=sys.stderr)
    child = "import os; os.write(1, b'child stdout\\\\n'); os.write(2, b'child stderr\\\\n')"
    subprocess.run([sys.executable, "-c", child], check=True)
    print("for the user", file=console)
print("after")
"""


def test_engine_output_goes_to_the_file_and_rpeg_lines_to_the_terminal(tmp_path):
    """Python's streams and a child process's descriptors, inside the block, land in the file;
    the stream the block yields, and everything before and after it, on the terminal."""
    log = tmp_path / "engines.log"
    log.write_text("earlier run\n")
    r = subprocess.run([sys.executable, "-c", _PROBE, str(log)], capture_output=True, text=True, check=True)
    assert r.stdout == "before\nafter\n"
    assert r.stderr == "for the user\n"
    lines = log.read_text().splitlines()
    assert lines[0] == "earlier run"  # appended to
    assert sorted(lines[1:]) == ["child stderr", "child stdout", "python stderr", "python stdout"]
