"""Readers for PSPLIB project files (Kolisch & Sprecher 1997) and their published optima.

``.sm`` (single-mode RCPSP) and ``.mm`` (multi-mode MRCPSP) files share one layout::

    jobs (incl. supersource/sink ):  32
      - renewable                 :  4   R
      - nonrenewable              :  0   N
      - doubly constrained        :  0   D
    PRECEDENCE RELATIONS:
    jobnr.    #modes  #successors   successors
       1        1          3           2   3   4
    REQUESTS/DURATIONS:
    jobnr. mode duration  R 1  R 2  R 3  R 4
    ------------------------------------------------------------------------
      1      1     0       0    0    0    0
      2      1     2       1    2    4    0          (later modes of a job omit the job number)
    RESOURCEAVAILABILITIES:
      R 1  R 2  R 3  R 4
       24   23   25   33

Job ``j`` becomes activity ``j-1`` (the dummy source and sink included, with duration 0), mode
``m`` becomes mode index ``m-1``, renewable resources come first then non-renewable ones, and
every successor list gives a lag-0 finish-to-start precedence.

A malformed file raises :class:`~rpeg.ir.errors.InputError` (a ``ValueError``) naming the file,
the line number and the field, jobs numbered as in the file: a file that is not UTF-8 text, a job
count above the file's length, a duration above :data:`MAX_DURATION` or a demand or capacity
above :data:`MAX_UNITS` (so the horizon, at most the sum of the durations, stays small enough to
schedule), a job that succeeds itself, a cycle of successors (with the lines of its entries), and
a job none of whose modes fits the capacities (naming the job, the resource, the demand and the
capacity).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from ..ir.errors import InputError
from .project import Activity, Mode, Project, Resource, find_cycle

__all__ = ["MAX_DURATION", "MAX_UNITS", "read_mm", "read_optima", "read_sm"]

#: Makespan the j20 MM optimum file gives an instance with no feasible mode assignment.
NO_SOLUTION = 16384

#: Largest duration a PSPLIB file may give a mode (PSPLIB's own sets use 1–10): the list
#: scheduler, CP-SAT and the checker do not grow with the horizon, but a horizon of about
#: ``jobs × MAX_DURATION`` periods is what the time-indexed MILP would have to cover.
MAX_DURATION = 10**6

#: Largest demand or capacity (renewable or non-renewable) a PSPLIB file may give.
MAX_UNITS = 10**6

_INT = re.compile(r"[+-]?[0-9]+")


class _Lines:
    """The file's lines with a cursor, for error messages that name the line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        data = path.read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(
                f"{path.name}: not a text PSPLIB file (byte 0x{data[exc.start]:02x} at offset "
                f"{exc.start} is not UTF-8 text)",
                source=str(path),
            ) from None
        nul = text.find("\x00")
        if nul >= 0:
            raise InputError(
                f"{path.name}: not a text PSPLIB file (a NUL byte at offset {nul})", source=str(path)
            )
        self.lines = text.splitlines()
        self.pos = 0

    def fail(self, what: str, lineno: int | None = None) -> InputError:
        """``<file>[:<line>]: <what>`` as an :class:`InputError`."""
        where = self.path.name if lineno is None else f"{self.path.name}:{lineno}"
        return InputError(f"{where}: {what}", source=str(self.path))

    def error(self, lineno: int, what: str) -> InputError:
        text = self.lines[lineno - 1].strip() if 0 < lineno <= len(self.lines) else "<end of file>"
        return self.fail(f"{what}, got {text!r}", lineno)

    def find(self, prefix: str) -> int:
        """Advance to the line starting with ``prefix`` (after stripping); return its 1-based number."""
        while self.pos < len(self.lines):
            self.pos += 1
            if self.lines[self.pos - 1].strip().lower().startswith(prefix.lower()):
                return self.pos
        raise self.fail(f"section {prefix!r} not found")

    def next(self) -> tuple[int, str]:
        self.pos += 1
        if self.pos > len(self.lines):
            raise self.error(self.pos, "unexpected end of file")
        return self.pos, self.lines[self.pos - 1]

    def ints(self, lineno: int, text: str, what: str) -> list[int]:
        tokens = text.split()
        # ASCII digits only: int() would also take "1_000" and other scripts' digits
        if not all(_INT.fullmatch(t) for t in tokens):
            raise self.error(lineno, f"{what}: expected integers")
        try:
            return [int(t) for t in tokens]
        except ValueError:  # more digits than Python converts
            raise self.error(lineno, f"{what}: expected integers") from None

    def count_after_colon(self, prefix: str) -> int:
        lineno = self.find(prefix)
        text = self.lines[lineno - 1]
        m = re.search(r":\s*(-?[0-9]{1,18})(?![0-9])", text)
        if m is None:
            raise self.error(lineno, f"{prefix.strip()}: expected ': <integer>' of at most 18 digits")
        return int(m.group(1))


def _read(path: str | Path, *, single_mode: bool) -> Project:
    f = _Lines(Path(path))
    n = f.count_after_colon("jobs (incl. supersource/sink")
    if n < 1:
        raise f.error(f.pos, f"jobs: expected a positive count, got {n}")
    if n > len(f.lines):  # one precedence row per job at least; refused before allocating per job
        raise f.error(f.pos, f"jobs: {n} jobs cannot fit in a file of {len(f.lines)} lines")
    n_ren = f.count_after_colon("- renewable")
    n_non = f.count_after_colon("- nonrenewable")
    n_dbl = f.count_after_colon("- doubly constrained")
    if n_ren < 0 or n_non < 0:
        raise f.error(f.pos, "resources: expected non-negative counts")
    if n_dbl != 0:
        raise f.error(f.pos, "doubly constrained resources: only 0 is supported")
    K = n_ren + n_non

    def name(k: int) -> str:
        return f"R{k + 1}" if k < n_ren else f"N{k - n_ren + 1}"

    # precedence relations
    f.find("PRECEDENCE RELATIONS")
    f.next()  # column header
    n_modes = [0] * n
    precs: list[tuple[int, int, int]] = []
    prec_lines: list[int] = []  # the line of each successor entry
    for j in range(n):
        lineno, text = f.next()
        row = f.ints(lineno, text, "precedence row")
        if len(row) < 3 or row[0] != j + 1:
            raise f.error(
                lineno, f"precedence row of job {j + 1}: expected 'jobnr #modes #successors successors…'"
            )
        _, nm, ns = row[:3]
        succ = row[3:]
        if nm < 1:
            raise f.error(lineno, f"#modes of job {j + 1}: expected ≥ 1")
        if single_mode and nm != 1:
            raise f.error(lineno, f"#modes of job {j + 1}: a .sm file has one mode per job")
        if len(succ) != ns:
            raise f.error(
                lineno, f"successors of job {j + 1}: #successors says {ns}, the row lists {len(succ)}"
            )
        for s in succ:
            if not 1 <= s <= n:
                raise f.error(lineno, f"successor {s} of job {j + 1}: expected a job in 1..{n}")
            if s == j + 1:
                raise f.error(lineno, f"successor {s} of job {j + 1}: a job cannot succeed itself")
            precs.append((j, s - 1, 0))
            prec_lines.append(lineno)
        n_modes[j] = nm
    cycle = find_cycle(n, [(i, j) for i, j, _ in precs])
    if cycle is not None:
        jobs = [precs[e][0] + 1 for e in cycle]
        path = " → ".join(str(j) for j in [*jobs, jobs[0]])
        entries = ", ".join(f"{prec_lines[e]} (job {precs[e][0] + 1} → {precs[e][1] + 1})" for e in cycle)
        raise f.fail(
            f"the successors form a cycle: job {path}; the entries on lines {entries}",
            prec_lines[cycle[-1]],
        )

    # requests and durations
    f.find("REQUESTS/DURATIONS")
    f.next()  # column header
    lineno, text = f.next()
    if not text.strip().startswith("-"):
        raise f.error(lineno, "REQUESTS/DURATIONS: expected the dashed line under the header")
    modes: list[list[Mode]] = [[] for _ in range(n)]
    mode_lines: list[list[int]] = [[] for _ in range(n)]
    job = 0
    for _ in range(sum(n_modes)):
        lineno, text = f.next()
        row = f.ints(lineno, text, "request row")
        if len(row) == K + 3:
            if job and len(modes[job - 1]) < n_modes[job - 1]:
                raise f.error(lineno, f"job {job}: expected {n_modes[job - 1]} mode rows before the next job")
            job, row = row[0], row[1:]
            if not 1 <= job <= n or modes[job - 1]:
                raise f.error(lineno, f"jobnr {job}: expected a new job in 1..{n}")
        elif len(row) != K + 2 or job == 0 or len(modes[job - 1]) >= n_modes[job - 1]:
            raise f.error(lineno, f"request row: expected 'jobnr mode duration' and {K} demands")
        mode, dur, demands = row[0], row[1], tuple(row[2:])
        if mode != len(modes[job - 1]) + 1 or mode > n_modes[job - 1]:
            raise f.error(lineno, f"mode of job {job}: expected mode {len(modes[job - 1]) + 1}")
        if dur > MAX_DURATION:
            raise f.error(
                lineno,
                f"job {job} mode {mode}: duration {dur} is above the limit of {MAX_DURATION:,} "
                "periods (MAX_DURATION)",
            )
        for k, r in enumerate(demands):
            if r > MAX_UNITS:
                raise f.error(
                    lineno,
                    f"job {job} mode {mode}: demand {r} of resource {name(k)} is above the limit of "
                    f"{MAX_UNITS:,} units (MAX_UNITS)",
                )
        try:
            modes[job - 1].append(Mode(dur, demands))
        except ValueError as e:
            raise f.error(lineno, f"job {job} mode {mode}: {e}") from None
        mode_lines[job - 1].append(lineno)
    for j in range(n):
        if len(modes[j]) != n_modes[j]:
            raise f.fail(f"job {j + 1} has {len(modes[j])} modes listed, expected {n_modes[j]}")

    # capacities
    f.find("RESOURCEAVAILABILITIES")
    f.next()  # resource names
    cap_line, text = f.next()
    caps = f.ints(cap_line, text, "resource availabilities")
    if len(caps) != K:
        raise f.error(cap_line, f"resource availabilities: expected {K} integers")
    if any(c < 0 for c in caps):
        raise f.error(cap_line, "resource availabilities: expected non-negative integers")
    for k, c in enumerate(caps):
        if c > MAX_UNITS:
            raise f.error(
                cap_line,
                f"capacity {c} of resource {name(k)} is above the limit of {MAX_UNITS:,} units (MAX_UNITS)",
            )
    _check_fit(f, modes, mode_lines, caps, name, cap_line)
    resources = tuple(Resource(c, renewable=k < n_ren, name=name(k)) for k, c in enumerate(caps))
    acts = tuple(Activity(tuple(ms), name=str(j + 1)) for j, ms in enumerate(modes))
    try:
        return Project(acts, resources, tuple(precs), name=f.path.stem)
    except ValueError as e:
        raise f.fail(str(e)) from None


def _check_fit(
    f: _Lines,
    modes: list[list[Mode]],
    lines: list[list[int]],
    caps: list[int],
    name: Callable[[int], str],
    cap_line: int,
) -> None:
    """Refuse a job none of whose modes fits every capacity on its own (no schedule could run
    it), naming the job, each mode's first demand over its resource's capacity and the lines."""
    for j, ms in enumerate(modes):
        over = []
        for m, mode in enumerate(ms):
            k = next((k for k, r in enumerate(mode.demands) if r > caps[k]), None)
            if k is None:
                break
            over.append((m, k, mode.demands[k]))
        else:
            what = "; ".join(
                f"mode {m + 1} (line {lines[j][m]}) demands {r} of resource {name(k)}, whose capacity "
                f"is {caps[k]}"
                for m, k, r in over
            )
            raise f.fail(f"job {j + 1} cannot run: {what} (capacities on line {cap_line})", lines[j][0])


def read_sm(path: str | Path) -> Project:
    """Read a single-mode PSPLIB file (``j30.sm`` and the like).

    Returns
    -------
    Project
        One mode per activity; renewable resources only in practice (non-renewable ones are read
        if the header declares any).

    Raises
    ------
    InputError
        A ``ValueError``: on a malformed file (the message names the file, line and field; see the
        module docstring for what is refused) or a job with more than one mode.
    """
    return _read(path, single_mode=True)


def read_mm(path: str | Path) -> Project:
    """Read a multi-mode PSPLIB file (``j20.mm`` and the like): renewable ``R`` resources are
    per-instant capacities, non-renewable ``N`` resources project budgets.

    Raises
    ------
    InputError
        A ``ValueError``: on a malformed file (the message names the file, line and field; see the
        module docstring for what is refused).
    """
    return _read(path, single_mode=False)


def read_optima(path: str | Path) -> dict[str, int]:
    """Published optimal makespans, keyed by instance file stem (``"j301_1"``, ``"j2010_1"``).

    Two layouts are read:

    - ``optimum.csv`` with header ``problem,optimum`` and rows ``j301_1.sm,43``;
    - the PSPLIB ``j20opt.mm`` table: a free-text header, then rows
      ``parameter instance makespan cpu-time`` (instance ``j20{parameter}_{instance}``). Rows with
      makespan 16384 mark instances without any feasible schedule (their non-renewable budgets
      cannot be met); they are left out, and the set ships no file for them.

    Raises
    ------
    ValueError
        On a row that does not parse (the message names the line).
    """
    path = Path(path)
    lines = path.read_text().splitlines()
    out: dict[str, int] = {}
    if path.suffix == ".csv":
        for lineno, line in enumerate(lines, 1):
            if lineno == 1 or not line.strip():
                continue
            parts = [p.strip() for p in line.split(",")]
            if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
                raise ValueError(f"{path.name}:{lineno}: expected 'problem,optimum', got {line.strip()!r}")
            out[parts[0].rsplit(".", 1)[0]] = int(parts[1])
        return out
    prefix = path.stem.removesuffix("opt").lower() or "j"
    started = False
    for lineno, line in enumerate(lines, 1):
        text = line.strip()
        m = re.match(r"Instance Set\s*:\s*(\S+)", text)
        if m:
            prefix = m.group(1).lower()
        if not started:
            started = text.startswith("----")
            continue
        if not text:
            continue
        parts = text.split()
        try:
            param, inst, makespan = int(parts[0]), int(parts[1]), int(parts[2])
            float(parts[3])
        except (ValueError, IndexError):
            raise ValueError(
                f"{path.name}:{lineno}: expected 'parameter instance makespan cpu-time', got {text!r}"
            ) from None
        if makespan != NO_SOLUTION:
            out[f"{prefix}{param}_{inst}"] = makespan
    if not started:
        raise ValueError(f"{path.name}: no '----' line before the table of optima")
    return out
