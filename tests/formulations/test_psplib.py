"""Tests for ``formulations/psplib.py`` (PSPLIB readers); the data model has ``test_project.py``
and ``test_status.py``.

The readers are checked against figures read off the files by hand (``j301_1.sm``,
``j2010_1.mm``), against every file of both sets (counts, bounds never above the published
optimum), and on malformed copies whose errors must name the line and the field.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rpeg.formulations import (
    Mode,
    read_mm,
    read_optima,
    read_sm,
)
from rpeg.ir.errors import InputError

PSPLIB = Path(__file__).resolve().parents[1] / "data" / "psplib"


@pytest.fixture(scope="module")
def psplib() -> Path:
    return PSPLIB


# ---------------------------------------------------------------------------------- readers
def test_read_sm_matches_the_file(psplib):
    p = read_sm(psplib / "j30.sm" / "j301_1.sm")
    assert p.name == "j301_1"
    assert p.num_activities == 32
    assert [r.capacity for r in p.resources] == [12, 13, 4, 12]
    assert all(r.renewable and not r.unary for r in p.resources)
    assert all(len(a.modes) == 1 for a in p.activities)
    # job 1 (dummy source): duration 0, successors 2 3 4; job 2: duration 8, demands 4 0 0 0,
    # successors 6 11 15
    assert p.activities[0].modes[0] == Mode(0, (0, 0, 0, 0))
    assert p.activities[1].modes[0] == Mode(8, (4, 0, 0, 0))
    assert [s for s, _ in p.successors[0]] == [1, 2, 3]
    assert [s for s, _ in p.successors[1]] == [5, 10, 14]
    assert all(lag == 0 for _, _, lag in p.precedences)
    assert p.activities[-1].modes[0].duration == 0 and not p.successors[-1]


def test_read_mm_reads_modes_and_nonrenewable_budgets(psplib):
    p = read_mm(psplib / "j20.mm" / "j2010_1.mm")
    assert p.num_activities == 22
    assert [(r.name, r.capacity, r.renewable) for r in p.resources] == [
        ("R1", 14, True),
        ("R2", 16, True),
        ("N1", 60, False),
        ("N2", 68, False),
    ]
    assert p.renewable == (0, 1) and p.nonrenewable == (2, 3)
    # job 2: modes (2; 9 0 9 0), (4; 0 6 6 0), (6; 9 0 3 0)
    assert p.activities[1].modes == (Mode(2, (9, 0, 9, 0)), Mode(4, (0, 6, 6, 0)), Mode(6, (9, 0, 3, 0)))
    assert len(p.activities[0].modes) == 1 and len(p.activities[-1].modes) == 1


def test_read_sm_refuses_a_multi_mode_file(psplib):
    with pytest.raises(ValueError, match=r"j2010_1\.mm:\d+: #modes of job 2"):
        read_sm(psplib / "j20.mm" / "j2010_1.mm")


def test_optima_files(psplib):
    sm = read_optima(psplib / "j30.sm" / "optimum.csv")
    assert len(sm) == 480 and sm["j301_1"] == 43 and sm["j3048_10"] > 0
    mm = read_optima(psplib / "j20.mm" / "j20opt.mm")
    # PSPLIB has 554 j20.mm instances with an optimum; the other rows say 16384 (no feasible
    # schedule) and are left out. tests/data ships a subset of the files, each with its optimum.
    files = {f.stem for f in (psplib / "j20.mm").glob("j20*_*.mm")}
    assert files <= set(mm) and len(mm) == 554
    assert mm["j2010_1"] == 18 and mm["j2064_10"] == 22
    assert 16384 not in mm.values()


def test_every_shipped_instance_reads_and_its_bounds_stay_below_the_optimum(psplib):
    for folder, pattern, reader, opt_file in (
        ("j30.sm", "*.sm", read_sm, "optimum.csv"),
        ("j20.mm", "j20*_*.mm", read_mm, "j20opt.mm"),
    ):
        optima = read_optima(psplib / folder / opt_file)
        files = sorted((psplib / folder).glob(pattern))
        assert len(files) >= 50 and {f.stem for f in files} <= set(optima)  # the shipped subset
        for f in files:
            p = reader(f)
            assert p.lower_bound() <= optima[p.name] <= p.trivial_horizon(), p.name


# -------------------------------------------------------------------------------- malformed
def _mutate(tmp_path: Path, src: Path, old: str, new: str, name: str = "bad.sm") -> Path:
    text = src.read_text()
    assert old in text
    out = tmp_path / name
    out.write_text(text.replace(old, new, 1))
    return out


def _line_of(path: Path, needle: str) -> int:
    return next(k for k, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


def test_malformed_successor_count_names_the_line(psplib, tmp_path):
    src = psplib / "j30.sm" / "j301_1.sm"
    bad = _mutate(
        tmp_path,
        src,
        "   2        1          3           6  11  15",
        "   2        1          3           6  11",
    )
    line = _line_of(bad, "   2        1          3           6  11")
    with pytest.raises(ValueError, match=rf"bad\.sm:{line}: successors of job 2: #successors says 3"):
        read_sm(bad)


def test_malformed_duration_names_the_line_and_field(psplib, tmp_path):
    src = psplib / "j30.sm" / "j301_1.sm"
    bad = _mutate(
        tmp_path, src, "  2      1     8       4    0    0    0", "  2      1     x       4    0    0    0"
    )
    line = _line_of(bad, "  2      1     x")
    with pytest.raises(ValueError, match=rf"bad\.sm:{line}: request row: expected integers"):
        read_sm(bad)


def test_malformed_demand_count_and_capacities(psplib, tmp_path):
    src = psplib / "j30.sm" / "j301_1.sm"
    bad = _mutate(
        tmp_path, src, "  2      1     8       4    0    0    0", "  2      1     8       4    0    0"
    )
    with pytest.raises(
        ValueError, match=r"bad\.sm:\d+: request row: expected 'jobnr mode duration' and 4 demands"
    ):
        read_sm(bad)
    bad = _mutate(tmp_path, src, "   12   13    4   12", "   12   13    4", name="cap.sm")
    line = _line_of(bad, "   12   13    4")
    with pytest.raises(ValueError, match=rf"cap\.sm:{line}: resource availabilities: expected 4 integers"):
        read_sm(bad)


def test_missing_section_and_bad_header(psplib, tmp_path):
    src = psplib / "j30.sm" / "j301_1.sm"
    bad = _mutate(tmp_path, src, "RESOURCEAVAILABILITIES:", "AVAILABILITIES:")
    with pytest.raises(ValueError, match=r"bad\.sm: section 'RESOURCEAVAILABILITIES' not found"):
        read_sm(bad)
    bad = _mutate(
        tmp_path,
        src,
        "jobs (incl. supersource/sink ):  32",
        "jobs (incl. supersource/sink ):  many",
        "hdr.sm",
    )
    with pytest.raises(
        ValueError, match=r"hdr\.sm:6: jobs \(incl\. supersource/sink: expected ': <integer>'"
    ):
        read_sm(bad)


def test_malformed_optimum_rows(tmp_path):
    csv = tmp_path / "optimum.csv"
    csv.write_text("problem,optimum\nj301_1.sm,43\nj301_2.sm,forty\n")
    with pytest.raises(ValueError, match=r"optimum\.csv:3: expected 'problem,optimum'"):
        read_optima(csv)
    mm = tmp_path / "j20opt.mm"
    mm.write_text(
        "Instance Set\t\t:J20\n   Paramter Instance  Makespan\tCPU-Time[sec.]\n----\n 1 1 18 0.3\n 1 two 19 0.1\n"
    )
    with pytest.raises(ValueError, match=r"j20opt\.mm:5: expected 'parameter instance makespan cpu-time'"):
        read_optima(mm)


# ------------------------------------------------------------------------------- data model


# ------------------------------------------------------- bad files: sizes, cycles, fit, bytes
def _psplib_text(durations, demands, caps, succ, modes=None) -> str:
    """A small ``.sm``/``.mm`` text: ``demands[j]`` (or ``modes[j]``, a list of
    ``(duration, demands)``) per job, ``succ[j]`` the 1-based successors of job ``j + 1``."""
    n, K = len(succ), len(caps)
    modes = modes or [[(d, r)] for d, r in zip(durations, demands)]
    lines = [
        "************************************************************************",
        f"jobs (incl. supersource/sink ):  {n}",
        f"  - renewable                 :  {K}   R",
        "  - nonrenewable              :  0   N",
        "  - doubly constrained        :  0   D",
        "PRECEDENCE RELATIONS:",
        "jobnr.    #modes  #successors   successors",
    ]
    lines += [
        f"   {j + 1}   {len(modes[j])}   {len(s)}   " + "  ".join(map(str, s)) for j, s in enumerate(succ)
    ]
    lines += ["REQUESTS/DURATIONS:", "jobnr. mode duration  " + "  ".join(f"R {k + 1}" for k in range(K))]
    lines.append("-" * 72)
    for j, ms in enumerate(modes):
        for m, (d, r) in enumerate(ms):
            head = f"  {j + 1}" if m == 0 else "   "
            lines.append(f"{head}   {m + 1}   {d}   " + "  ".join(map(str, r)))
    lines += ["RESOURCEAVAILABILITIES:", "  " + "  ".join(f"R {k + 1}" for k in range(K))]
    lines += ["  " + "  ".join(map(str, caps)), "*" * 72]
    return "\n".join(lines) + "\n"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    out = tmp_path / name
    out.write_text(text)
    return out


def _chain(durations, demands=None, caps=(4,)):
    """Jobs 1 → 2 → … → n (dummy source and sink with duration 0 included by the caller)."""
    n = len(durations)
    demands = demands or [(1,) * len(caps)] * n
    succ = [[j + 2] for j in range(n - 1)] + [[]]
    return _psplib_text(durations, demands, caps, succ)


def _cli(capsys, *args: str) -> tuple[int, str]:
    """``rpeg project *args``: the exit status and stderr (stdout stays in ``capsys``)."""
    from rpeg.cli import main

    status = main(["project", *args])
    return status, capsys.readouterr().err


def test_the_helper_writes_a_file_the_reader_takes(tmp_path):
    p = read_sm(_write(tmp_path, "ok.sm", _chain([0, 3, 2, 0])))
    assert [a.modes[0].duration for a in p.activities] == [0, 3, 2, 0]
    assert [(i, j) for i, j, _ in p.precedences] == [(0, 1), (1, 2), (2, 3)]


@pytest.mark.parametrize("method", ["list", "cpsat", "milp"])
def test_a_huge_duration_is_refused_naming_the_job_and_the_duration(tmp_path, capsys, method):
    # issue 33: a duration of 1e9 gave a MemoryError (list) or 15-23 GB and an OOM kill
    bad = _write(tmp_path, "huge.sm", _chain([0, 3, 10**9, 2, 0]))
    line = _line_of(bad, "1000000000")
    with pytest.raises(
        InputError, match=rf"huge\.sm:{line}: job 3 mode 1: duration 1000000000 is above the limit"
    ):
        read_sm(bad)
    status, err = _cli(capsys, str(bad), "--method", method, "--time-limit", "10")
    assert status == 2 and "job 3 mode 1: duration 1000000000" in err and "MAX_DURATION" in err


def test_huge_demands_capacities_and_job_counts_are_refused(tmp_path):
    bad = _write(tmp_path, "dem.sm", _chain([0, 3, 0], [(0,), (10**7,), (0,)], caps=(10**7,)))
    with pytest.raises(
        InputError, match=r"dem\.sm:\d+: job 2 mode 1: demand 10000000 of resource R1 is above"
    ):
        read_sm(bad)
    bad = _write(tmp_path, "cap.sm", _chain([0, 3, 0], caps=(10**12,)))
    with pytest.raises(InputError, match=r"cap\.sm:\d+: capacity 1000000000000 of resource R1 is above"):
        read_sm(bad)
    text = _chain([0, 3, 0]).replace(
        "jobs (incl. supersource/sink ):  3", f"jobs (incl. supersource/sink ):  {10**12}"
    )
    bad = _write(tmp_path, "jobs.sm", text)
    with pytest.raises(
        InputError, match=r"jobs\.sm:2: jobs: 1000000000000 jobs cannot fit in a file of \d+ lines"
    ):
        read_sm(bad)
    # ASCII digits only ("1_000" is an int to Python, not to PSPLIB)
    bad = _write(tmp_path, "us.sm", _chain([0, 3, 0]).replace("  2   1   3   1", "  2   1   3_0   1"))
    with pytest.raises(InputError, match=r"us\.sm:\d+: request row: expected integers"):
        read_sm(bad)


def test_the_longest_allowed_durations_are_scheduled_quickly(tmp_path, capsys):
    # at the limit: the list schedule and its check do not grow with the horizon, and the MILP
    # refuses to build a time-indexed model over millions of periods (returns the list schedule)
    import time

    from rpeg.cli import main
    from rpeg.formulations.psplib import MAX_DURATION

    succ = [[2, 3, 4], [5], [5], [5], []]
    path = _write(
        tmp_path,
        "long.sm",
        _psplib_text(
            [0, MAX_DURATION, MAX_DURATION, MAX_DURATION, 0], [(0,), (1,), (1,), (1,), (0,)], (2,), succ
        ),
    )
    for method in ("list", "milp"):
        t0 = time.perf_counter()
        status = main(["project", str(path), "--method", method, "--time-limit", "20"])
        out = capsys.readouterr().out
        assert status == 0 and "schedule   valid" in out, out
        assert f"makespan   {2 * MAX_DURATION}" in out
        assert time.perf_counter() - t0 < 30  # seconds on a loaded machine; was a MemoryError
        if method == "milp":
            assert "time-indexed model not built" in out and "returned the list schedule" in out


def test_a_self_loop_names_the_job_and_the_line(tmp_path, capsys):
    bad = _write(tmp_path, "loop.sm", _psplib_text([0, 2, 0], [(0,), (1,), (0,)], (1,), [[2], [2, 3], []]))
    line = _line_of(bad, "   2   1   2   2  3")
    with pytest.raises(
        InputError, match=rf"loop\.sm:{line}: successor 2 of job 2: a job cannot succeed itself"
    ):
        read_sm(bad)
    status, err = _cli(capsys, str(bad))
    assert status == 2 and f"loop.sm:{line}: successor 2 of job 2" in err


def _refused(capsys, path, expected: str, *methods: str) -> None:
    """Reading ``path`` raises exactly ``expected``, and ``rpeg project`` (with each method, or
    its default) exits 2 with it."""
    with pytest.raises(InputError) as info:
        read_sm(path)
    assert str(info.value) == expected
    for method in methods or (None,):
        status, err = _cli(capsys, str(path), *(("--method", method) if method else ()))
        assert status == 2 and expected in err


def test_a_cycle_is_reported_with_file_job_numbers_and_lines(tmp_path, capsys):
    # 1 → 2 → 3 → 4 → 2 (0-based 1 → 2 → 3 → 1 before): jobs as the file numbers them
    succ = [[2], [3], [4], [2, 5], []]
    bad = _write(
        tmp_path, "cyc.sm", _psplib_text([0, 1, 1, 1, 0], [(0,), (1,), (1,), (1,), (0,)], (1,), succ)
    )
    l2, l3, l4 = (_line_of(bad, f"   {j}   1   ") for j in (2, 3, 4))
    expected = (
        f"cyc.sm:{l4}: the successors form a cycle: job 2 → 3 → 4 → 2; the entries on lines "
        f"{l2} (job 2 → 3), {l3} (job 3 → 4), {l4} (job 4 → 2)"
    )
    _refused(capsys, bad, expected)


def test_a_demand_above_the_capacity_is_refused_naming_job_resource_demand_capacity(tmp_path, capsys):
    # issue 33: was exit 3 "status infeasible, makespan inf"
    bad = _write(tmp_path, "over.sm", _chain([0, 2, 3, 0], [(0, 0), (1, 1), (2, 7), (0, 0)], caps=(4, 5)))
    line, cap_line = _line_of(bad, "  3   1   3"), len(bad.read_text().splitlines()) - 1
    expected = (
        f"over.sm:{line}: job 3 cannot run: mode 1 (line {line}) demands 7 of resource R2, whose "
        f"capacity is 5 (capacities on line {cap_line})"
    )
    _refused(capsys, bad, expected, "list", "cpsat", "milp")


def test_a_multi_mode_job_is_refused_only_when_no_mode_fits(tmp_path):
    modes = [[(0, (0,))], [(2, (9,)), (4, (3,))], [(0, (0,))]]
    ok = _write(tmp_path, "ok.mm", _psplib_text(None, None, (4,), [[2], [3], []], modes))
    assert read_mm(ok).usable_modes[1] == (1,)
    modes[1] = [(2, (9,)), (4, (5,))]
    bad = _write(tmp_path, "bad.mm", _psplib_text(None, None, (4,), [[2], [3], []], modes))
    with pytest.raises(
        InputError,
        match=r"bad\.mm:\d+: job 2 cannot run: mode 1 \(line \d+\) demands 9 of resource R1, whose capacity "
        r"is 4; mode 2 \(line \d+\) demands 5 of resource R1",
    ):
        read_mm(bad)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", r"byte 0x89 at offset 0 is not UTF-8"),
        (b"jobs\x00\x01", "a NUL byte"),
    ],
)
def test_a_binary_file_is_named_and_called_not_text(tmp_path, capsys, data, why):
    bad = tmp_path / "image.sm"
    bad.write_bytes(data)
    with pytest.raises(InputError, match=rf"image\.sm: not a text PSPLIB file \({why}"):
        read_sm(bad)
    status, err = _cli(capsys, str(bad))
    assert status == 2 and "image.sm: not a text PSPLIB file" in err
