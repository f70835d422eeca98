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
every successor list gives a lag-0 finish-to-start precedence. A malformed file raises
``ValueError`` naming the file, the line number and the field.
"""

from __future__ import annotations

import re
from pathlib import Path

from .project import Activity, Mode, Project, Resource

__all__ = ["read_mm", "read_optima", "read_sm"]

#: Makespan the j20 MM optimum file gives an instance with no feasible mode assignment.
NO_SOLUTION = 16384


class _Lines:
    """The file's lines with a cursor, for error messages that name the line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines = path.read_text().splitlines()
        self.pos = 0

    def error(self, lineno: int, what: str) -> ValueError:
        text = self.lines[lineno - 1].strip() if 0 < lineno <= len(self.lines) else "<end of file>"
        return ValueError(f"{self.path.name}:{lineno}: {what}, got {text!r}")

    def find(self, prefix: str) -> int:
        """Advance to the line starting with ``prefix`` (after stripping); return its 1-based number."""
        while self.pos < len(self.lines):
            self.pos += 1
            if self.lines[self.pos - 1].strip().lower().startswith(prefix.lower()):
                return self.pos
        raise ValueError(f"{self.path.name}: section {prefix!r} not found")

    def next(self) -> tuple[int, str]:
        self.pos += 1
        if self.pos > len(self.lines):
            raise self.error(self.pos, "unexpected end of file")
        return self.pos, self.lines[self.pos - 1]

    def ints(self, lineno: int, text: str, what: str) -> list[int]:
        try:
            return [int(t) for t in text.split()]
        except ValueError:
            raise self.error(lineno, f"{what}: expected integers") from None

    def count_after_colon(self, prefix: str) -> int:
        lineno = self.find(prefix)
        text = self.lines[lineno - 1]
        m = re.search(r":\s*(-?\d+)", text)
        if m is None:
            raise self.error(lineno, f"{prefix.strip()}: expected ': <integer>'")
        return int(m.group(1))


def _read(path: str | Path, *, single_mode: bool) -> Project:
    f = _Lines(Path(path))
    n = f.count_after_colon("jobs (incl. supersource/sink")
    if n < 1:
        raise f.error(f.pos, f"jobs: expected a positive count, got {n}")
    n_ren = f.count_after_colon("- renewable")
    n_non = f.count_after_colon("- nonrenewable")
    n_dbl = f.count_after_colon("- doubly constrained")
    if n_ren < 0 or n_non < 0:
        raise f.error(f.pos, "resources: expected non-negative counts")
    if n_dbl != 0:
        raise f.error(f.pos, "doubly constrained resources: only 0 is supported")
    K = n_ren + n_non

    # precedence relations
    f.find("PRECEDENCE RELATIONS")
    f.next()  # column header
    n_modes = [0] * n
    precs: list[tuple[int, int, int]] = []
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
            precs.append((j, s - 1, 0))
        n_modes[j] = nm

    # requests and durations
    f.find("REQUESTS/DURATIONS")
    f.next()  # column header
    lineno, text = f.next()
    if not text.strip().startswith("-"):
        raise f.error(lineno, "REQUESTS/DURATIONS: expected the dashed line under the header")
    modes: list[list[Mode]] = [[] for _ in range(n)]
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
        try:
            modes[job - 1].append(Mode(dur, demands))
        except ValueError as e:
            raise f.error(lineno, f"job {job} mode {mode}: {e}") from None
    for j in range(n):
        if len(modes[j]) != n_modes[j]:
            raise ValueError(
                f"{f.path.name}: job {j + 1} has {len(modes[j])} modes listed, expected {n_modes[j]}"
            )

    # capacities
    f.find("RESOURCEAVAILABILITIES")
    f.next()  # resource names
    lineno, text = f.next()
    caps = f.ints(lineno, text, "resource availabilities")
    if len(caps) != K:
        raise f.error(lineno, f"resource availabilities: expected {K} integers")
    if any(c < 0 for c in caps):
        raise f.error(lineno, "resource availabilities: expected non-negative integers")
    resources = tuple(
        Resource(c, renewable=k < n_ren, name=f"R{k + 1}" if k < n_ren else f"N{k - n_ren + 1}")
        for k, c in enumerate(caps)
    )
    acts = tuple(Activity(tuple(ms), name=str(j + 1)) for j, ms in enumerate(modes))
    try:
        return Project(acts, resources, tuple(precs), name=f.path.stem)
    except ValueError as e:
        raise ValueError(f"{f.path.name}: {e}") from None


def read_sm(path: str | Path) -> Project:
    """Read a single-mode PSPLIB file (``j30.sm`` and the like).

    Returns
    -------
    Project
        One mode per activity; renewable resources only in practice (non-renewable ones are read
        if the header declares any).

    Raises
    ------
    ValueError
        On a malformed file (the message names the file, line and field) or a job with more than
        one mode.
    """
    return _read(path, single_mode=True)


def read_mm(path: str | Path) -> Project:
    """Read a multi-mode PSPLIB file (``j20.mm`` and the like): renewable ``R`` resources are
    per-instant capacities, non-renewable ``N`` resources project budgets.

    Raises
    ------
    ValueError
        On a malformed file (the message names the file, line and field).
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
