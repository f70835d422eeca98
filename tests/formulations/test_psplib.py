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
