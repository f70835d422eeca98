"""Tests for ``formulations/pyomo_backend.py``: the solver registry, the status tables (every
termination condition maps to the right :class:`Status`, once), and solving a tiny model."""

from __future__ import annotations

import math

import pytest

from rpeg.formulations import pyomo_backend
from rpeg.formulations.pyomo_backend import APPSI_STATUS, LEGACY_STATUS, SolverUnavailableError, map_status
from rpeg.formulations.status import Status


def test_every_appsi_status_is_in_the_table():
    from pyomo.contrib.appsi.base import TerminationCondition

    assert set(TerminationCondition.__members__) <= set(APPSI_STATUS)


def test_every_legacy_status_is_in_the_table():
    from pyomo.opt import TerminationCondition

    assert {tc.name for tc in TerminationCondition} <= set(LEGACY_STATUS)


@pytest.mark.parametrize("table", [APPSI_STATUS, LEGACY_STATUS])
def test_each_termination_condition_maps_to_the_right_status(table):
    for name, mapped in table.items():
        with_incumbent = map_status(table, name, incumbent=True)
        without = map_status(table, name, incumbent=False)
        if mapped is None:  # decided by the incumbent
            assert (with_incumbent, without) == (Status.FEASIBLE, Status.UNKNOWN), name
        else:
            assert with_incumbent is without is mapped, name
        interrupted = map_status(table, name, incumbent=False, interrupted=True)
        proof = mapped in (Status.OPTIMAL, Status.INFEASIBLE)
        assert interrupted is (mapped if proof else Status.TIME_LIMIT), name
    assert table["optimal"] is Status.OPTIMAL and table["maxTimeLimit"] is Status.TIME_LIMIT
    assert table["infeasible"] is Status.INFEASIBLE and table["error"] is Status.ERROR
    assert map_status(table, "no-such-condition", incumbent=False) is Status.UNKNOWN


def test_the_registry_rejects_unknown_names_and_says_what_to_install():
    with pytest.raises(ValueError, match=r"unknown MILP solver 'nosuchsolver': known names are"):
        pyomo_backend.backend("nosuchsolver")
    assert pyomo_backend.backend("highs").pyomo_name == "appsi_highs"
    gurobi = pyomo_backend.MILP_SOLVERS["gurobi"]()
    if not gurobi.available():
        with pytest.raises(SolverUnavailableError, match="pip install gurobipy"):
            pyomo_backend.backend("gurobi")


def _tiny(lower: float):
    pyo = pyomo_backend.pyomo_environ()
    m = pyo.ConcreteModel()
    m.a = pyo.Var(within=pyo.NonNegativeIntegers, bounds=(0, 10))
    m.b = pyo.Var(within=pyo.NonNegativeIntegers, bounds=(0, 10))
    m.c = pyo.Constraint(expr=m.a + m.b >= lower)
    m.obj = pyo.Objective(expr=m.a + 2 * m.b, sense=pyo.minimize)
    return m


def test_run_pyomo_solves_with_highs_and_maps_infeasibility():
    m = _tiny(7)
    status, bound, incumbent = pyomo_backend.run_pyomo(m, "highs", 30, 0, 1, False)
    assert status is Status.OPTIMAL and incumbent and m.a.value == pytest.approx(7)
    assert bound == pytest.approx(7)
    assert not pyomo_backend.last_run_interrupted()
    status, bound, incumbent = pyomo_backend.run_pyomo(_tiny(30), "highs", 30, 0, 1, False)
    assert status is Status.INFEASIBLE and not incumbent
    assert not math.isnan(bound)
