"""The driver–worker protocol (``runtime/protocol.py``, ``runtime/driver/group.py``): every
declared method exists on the worker with what the driver sends, undeclared names and
group-wide methods on part of a group are refused, node calls carry the plan's and the
workload's choices, and the driver imports no torch."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys

import pytest

from rpeg.ir.types import Role
from rpeg.runtime.binding import bind
from rpeg.runtime.driver.group import WorkerGroup, call_worker
from rpeg.runtime.driver.liveness import Owner
from rpeg.runtime.protocol import PROTOCOL, Dispatch, NodeCall, ProtocolError, check_call
from rpeg.runtime.trace.records import expected_graph
from tests.runtime.plans import ONE_DEVICE, SMALL, hand, workload


def test_every_declared_method_is_a_worker_method():
    pytest.importorskip("torch")
    from rpeg.runtime.worker.core import Worker

    for name in PROTOCOL:
        method = getattr(Worker, name, None)
        assert callable(method), f"Worker lacks the protocol method {name!r}"
        assert not name.startswith("_")
    # the OP node's method takes the node call and its inputs
    assert list(inspect.signature(Worker.op).parameters) == ["self", "node", "inputs"]
    assert PROTOCOL["op"].returns == 3 and all(m.returns == 1 for n, m in PROTOCOL.items() if n != "op")


def test_undeclared_and_partial_group_calls_are_refused():
    with pytest.raises(ProtocolError, match="'getattr_anything' is not in the protocol"):
        check_call("getattr_anything", whole_group=True)
    with pytest.raises(ProtocolError, match="every live rank"):
        check_call("install", whole_group=False)  # ranks meet in collectives inside
    assert check_call("install", whole_group=True).dispatch is Dispatch.GROUP
    assert check_call("load", whole_group=False).dispatch is Dispatch.RANK


def test_the_worker_process_serves_only_the_protocol():
    from rpeg.runtime.worker.process import WorkerProcess

    proc = WorkerProcess()  # no worker built: the name is refused before it is looked up
    with pytest.raises(ProtocolError, match="'shutdown'"):
        proc.call(0, "shutdown")
    with pytest.raises(ProtocolError, match="'op'"):
        proc.call(0, "op")  # OP nodes come through op(), with three results
    with pytest.raises(ProtocolError, match="no worker of group g3 on this device"):
        proc.call(3, "info")
    with pytest.raises(ProtocolError, match="no worker of group g0"):
        proc.op(0, None, {})


def test_one_workers_concurrent_calls_run_in_turn_and_others_at_once():
    """A transition's calls to one worker run in the driver's order whatever order the threads
    start in; a call to another worker of the process is not held up by them; a refused call still
    passes its turn on."""
    import threading
    import time

    from rpeg.runtime.worker.process import WorkerProcess

    class Fake:
        def __init__(self, log: list) -> None:
            self.log = log

        def xfer_drop(self, keys: list) -> int:
            self.log.append(keys[0])
            return keys[0]

    proc, log = WorkerProcess(), []
    proc.workers = {0: Fake(log), 1: Fake(log)}
    threads = [
        threading.Thread(target=proc.call_concurrent, args=(0, turn, "xfer_drop", [f"a{turn}"]))
        for turn in (2, 1)  # started out of turn: they wait for turn 0
    ]
    for t in threads:
        t.start()
    time.sleep(0.2)
    assert proc.call_concurrent(1, 0, "xfer_drop", ["b0"]) == "b0"  # another worker: not held up
    assert log == ["b0"]
    with pytest.raises(ProtocolError):
        proc.call_concurrent(0, 0, "shutdown")  # refused, and turn 0 is passed on
    for t in threads:
        t.join(timeout=10)
    assert log == ["b0", "a1", "a2"]


class _Remote:
    def __init__(self, log: list, rank: int) -> None:
        self.log, self.rank = log, rank

    def remote(self, *args):
        self.log.append((self.rank, args))
        return f"ref-{self.rank}-{len(self.log)}"


class _Actor:
    def __init__(self, log: list, rank: int) -> None:
        self.call = _Remote(log, rank)
        self.call_concurrent = _Remote(log, rank)


@pytest.fixture(scope="module")
def small():
    result = hand(workload("ppo"), "1x1x2", SMALL, (("actor", 0), ("critic", 0)))
    return bind(result, expected_graph(result, 1), 1)


def test_a_group_call_goes_to_its_live_ranks_keyed_by_worker(small):
    g = next(g for g in small.groups if g.size == 2)
    log: list = []
    actors = [_Actor(log, r) for r in range(g.size)]
    owners = [Owner(g.worker(r), g.devices[r], actors[r], g.gid, r) for r in range(g.size)]
    dead: set = set()
    grp = WorkerGroup(g, actors, owners, dead)
    calls = grp.all("fetch", ("k",), [])
    assert [key for key, _ in calls] == [(g.gid, 0), (g.gid, 1)]
    assert log == [(0, (g.gid, "fetch", ("k",), [])), (1, (g.gid, "fetch", ("k",), []))]
    dead.add((g.gid, 0))  # the controller's set, shared: rank 0 is lost
    assert [key for key, _ in grp.all("rollback", 3)] == [(g.gid, 1)]
    assert grp.rank(1, "load", "f.pt")[0] == (g.gid, 1)
    with pytest.raises(ProtocolError):
        grp.rank(1, "publish")
    with pytest.raises(ProtocolError, match=r"call WorkerGroup.op\(\)"):
        grp.all("op")  # three results per call: only WorkerGroup.op sends it
    with pytest.raises(ProtocolError):
        call_worker(owners[1], "install", [], 0)
    assert call_worker(owners[1], "xfer_drop", []).startswith("ref-1")
    call_worker(owners[1], "xfer_drop", [1])
    # through call_concurrent, naming the group and the worker's turn (its calls keep their order)
    assert log[-2:] == [(1, (g.gid, 0, "xfer_drop", [])), (1, (g.gid, 1, "xfer_drop", [1]))]
    with pytest.raises(ValueError, match="1 actors"):
        WorkerGroup(g, actors[:1], owners, dead)


def test_node_calls_carry_the_plan_and_the_workload():
    wl = dataclasses.replace(workload("grpo"), mini_batches=2)
    result = hand(wl, "1x1x1", ONE_DEVICE, (("actor", 0),))
    b = bind(result, expected_graph(result, 1), 1)
    idx = b.graph.index
    gen = b.node_call(idx["actor_gen"], 0)
    train = b.node_call(idx["actor_train"], 0, publish=True, tau=0)
    assert isinstance(gen, NodeCall) and gen.role is Role.GENERATION and gen.output
    assert gen.mb == result.plan.choices[idx["actor_gen"]].strategy.mb
    assert gen.updates == 1 and train.updates == 2  # U optimizer updates per step (SPEC §14.2)
    assert train.role is Role.TRAINING and train.publish and train.save is None
    assert gen.reward == wl.reward and gen.reference == ("reference" in b.graph.models)
    with pytest.raises(dataclasses.FrozenInstanceError):
        gen.step = 1  # type: ignore[misc]


def test_remax_greedy_rollouts_are_kept_apart_by_name():
    result = hand(
        workload("remax"),
        "1x1x1",
        {
            v: ((0, 0, 0), (1, 1, 1), 1, 1, 1, 1)
            for v in ("actor_gen", "actor_greedy_gen", "ref_inf", "reward_inf", "actor_train")
        },
        (("actor", 0),),
    )
    b = bind(result, expected_graph(result, 1), 1)
    idx = b.graph.index
    greedy = b.node_call(idx["actor_greedy_gen"], 0)
    train = b.node_call(idx["actor_train"], 0, reads=[idx["actor_gen"], idx["actor_greedy_gen"]])
    assert greedy.greedy and not b.node_call(idx["actor_gen"], 0).greedy
    assert train.prefix == {"actor_greedy_gen": "greedy_"}


def test_the_driver_imports_no_torch():
    """What the import-linter contract states, checked as a process sees it: the driver's modules
    load without torch (or the worker package)."""
    code = (
        "import sys\n"
        "import rpeg.runtime.driver.runner, rpeg.runtime.driver.controller, rpeg.runtime.driver.recovery\n"
        "import rpeg.runtime.driver.transition, rpeg.runtime.driver.pool, rpeg.runtime.driver.group\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('rpeg.runtime.worker.') "
        "and m != 'rpeg.runtime.worker.process')\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
