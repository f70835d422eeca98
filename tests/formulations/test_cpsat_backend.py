"""Tests for ``formulations/cpsat_backend.py``: every CP-SAT status maps to the right
:class:`Status`, once; the parameters are set as asked; Ctrl-C and limits end honestly."""

from __future__ import annotations

import _thread
import signal
import threading
import time
import types

import pytest

from rpeg.formulations import cpsat_backend
from rpeg.formulations.cpsat_backend import STATUS, map_status
from rpeg.formulations.status import Status


def test_every_native_status_is_in_the_table():
    cp_model = cpsat_backend.cp_model()
    assert set(type(cp_model.OPTIMAL).__members__) == set(STATUS)


@pytest.mark.parametrize(
    ("name", "unlimited", "limited"),
    [
        ("OPTIMAL", Status.OPTIMAL, Status.OPTIMAL),
        ("FEASIBLE", Status.FEASIBLE, Status.TIME_LIMIT),
        ("INFEASIBLE", Status.INFEASIBLE, Status.INFEASIBLE),
        ("UNKNOWN", Status.UNKNOWN, Status.TIME_LIMIT),
        ("MODEL_INVALID", Status.ERROR, Status.ERROR),
        ("NOT_A_STATUS", Status.ERROR, Status.ERROR),
    ],
)
def test_each_native_status_maps_to_the_right_status(name, unlimited, limited):
    assert map_status(name, limited=False) is unlimited
    assert map_status(name, limited=True) is limited
    # Ctrl-C stops the search as the time limit would
    assert map_status(name, limited=False, interrupted=True) is limited


def test_configure_sets_every_parameter():
    cp_model = cpsat_backend.cp_model()
    solver = cp_model.CpSolver()
    cpsat_backend.configure(solver, time_limit=2.5, seed=7, threads=3, log=False)
    prm = solver.parameters
    assert (prm.max_time_in_seconds, prm.random_seed, prm.num_workers) == (2.5, 7, 3)
    assert not prm.log_search_progress
    assert prm.presolve_inclusion_work_limit == 0  # google/or-tools#5293: wrong optima with it on
    unset = cp_model.CpSolver()
    default_workers = unset.parameters.num_workers
    cpsat_backend.configure(unset)
    assert unset.parameters.num_workers == default_workers  # None: CP-SAT's default
    assert unset.parameters.max_time_in_seconds == cp_model.CpSolver().parameters.max_time_in_seconds


def _tiny(infeasible: bool = False):
    cp_model = cpsat_backend.cp_model()
    m = cp_model.CpModel()
    a, b = m.new_int_var(0, 10, "a"), m.new_int_var(0, 10, "b")
    m.add(a + b >= (30 if infeasible else 7))
    m.minimize(a + 2 * b)
    return m, a, b


def test_solve_maps_an_optimum_and_a_proven_infeasibility():
    m, a, b = _tiny()
    cpsat_backend.add_hints(m, [(a, 3), (b, 4)])
    run = cpsat_backend.solve(m, time_limit=10, seed=0, threads=1)
    assert run.status is Status.OPTIMAL and run.has_solution and not run.interrupted
    assert run.solver.objective_value == 7
    run = cpsat_backend.solve(_tiny(infeasible=True)[0], threads=1)
    assert run.status is Status.INFEASIBLE and not run.has_solution


def test_a_limit_of_zero_is_time_limit_and_no_limit_runs_to_the_proof():
    m, _, _ = _tiny()
    run = cpsat_backend.solve(m, time_limit=0.0, threads=1)
    assert run.status in (Status.TIME_LIMIT, Status.OPTIMAL)  # presolve may already prove it
    run = cpsat_backend.solve(m, threads=1)
    assert run.status is Status.OPTIMAL and run.has_solution


class _SlowSolver:
    """Stands in for a ``CpSolver``: its search runs until ``stop_search`` and sends Ctrl-C to
    the waiting thread once it has started."""

    def __init__(self) -> None:
        self.parameters = types.SimpleNamespace(catch_sigint_signal=True)
        self.stopped = threading.Event()

    def solve(self, model, callback=None):
        time.sleep(0.2)  # let the caller get back from Thread.start() to its waiting loop
        _thread.interrupt_main()
        assert self.stopped.wait(10)
        return "FEASIBLE"

    def stop_search(self) -> None:
        self.stopped.set()


def test_ctrl_c_stops_the_search_and_is_reported():
    # Python's own Ctrl-C handler, whatever this process inherited: a process started in the
    # background by a non-interactive shell ignores SIGINT, and interrupt_main() then does nothing
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        solver = _SlowSolver()
        code, interrupted = cpsat_backend.run_cpsat(solver, model=None)
    finally:
        signal.signal(signal.SIGINT, old)
    assert (code, interrupted) == ("FEASIBLE", True)
    assert solver.stopped.is_set() and solver.parameters.catch_sigint_signal is False
