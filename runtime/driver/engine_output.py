"""Engine output to a file: what vLLM, torch and their processes print while rpeg measures them.

vLLM's CPU build and torch write warnings, progress bars and tracebacks they recover from
(dozens of lines per engine start: Triton missing, NUMA binding, a chat-template warm-up without
a tokenizer) to the process's standard output and error, and the engine's own processes inherit
both. :func:`engine_output_to` points file descriptors 1 and 2 at a log file for a block, so
that everything the engines print there, in this process and in the processes it starts, lands
in the file, while rpeg's own lines go to the terminal through the stream it yields.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

__all__ = ["engine_output_to"]


@contextlib.contextmanager
def engine_output_to(path: str | Path) -> Iterator[TextIO]:
    """Inside the block, file descriptors 1 and 2 (standard output and error, of this process and
    of every process it starts) append to ``path``; the block gets a text stream on the standard
    error found on entry, for the lines meant for the user. Python's ``sys.stdout`` and
    ``sys.stderr`` are flushed on entry and exit, so that nothing buffered before lands in the
    file or after it on the terminal.

    Parameters
    ----------
    path
        The log file (created, or appended to).

    Raises
    ------
    OSError
        If ``path`` cannot be opened for appending.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    saved = [os.dup(1), os.dup(2)]
    console = os.fdopen(os.dup(saved[1]), "w", buffering=1, encoding="utf-8", errors="replace")
    try:
        os.dup2(log, 1)
        os.dup2(log, 2)
        yield console
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, log):
            os.close(fd)
        console.close()
