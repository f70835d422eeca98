"""A plan across two Ray nodes: ``rpeg run --address`` on a Ray cluster started on this machine
(``ray start`` processes on loopback addresses: a head without devices and two nodes with one
``rpeg_device`` each), one Ray node per plan node, with a verified trace; and the loss of a whole
Ray node mid-run, which takes the urgent path (replan on the surviving node).

Each node is a ``ray start --block`` process in its own session under one temporary directory
(the GCS port is picked by the OS: ``--port=0``); the test kills exactly those nodes' processes
at the end — never ``ray stop``, which would stop every Ray instance of the user, the test
session's included.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("ray")

from rpeg.ir import Workload
from rpeg.runtime.trace.records import Trace
from rpeg.runtime.trace.verify import verify
from tests.runtime.plans import TOY, hand

RAY = Path(sys.executable).parent / "ray"
#: Ray's token authentication, as a real cluster has it: every node and the driver hold the token.
_AUTH = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}


def _start_node(
    temp: str, ip: str, *, head_address: str | None, devices: int
) -> tuple[subprocess.Popen, str]:
    """One ``ray start --block`` node at loopback address ``ip`` with ``devices`` ``rpeg_device``
    resources and one CPU, its output in ``temp/<ip>.log``; returns the process and the cluster's
    GCS address (read from what ``ray start`` prints), waiting while the process lives."""
    args = [str(RAY), "start", "--block", f"--node-ip-address={ip}", "--num-cpus=1"]
    args += ["--resources", json.dumps({"rpeg_device": devices}), "--disable-usage-stats"]
    if head_address is None:
        args += ["--head", "--port=0", "--include-dashboard=false", f"--temp-dir={temp}"]
    else:
        args += [f"--address={head_address}"]
    log = Path(temp) / f"{ip}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped as one at the end
            env={**os.environ, **_AUTH, "RAY_worker_niceness": "0"},
        )
    while proc.poll() is None:  # ray start says where the cluster is, then that it blocks
        text = log.read_text()
        found = re.search(r"ray start --address='([^']+)'", text)
        if found and head_address is None:
            head_address = found.group(1)
        if "Ray runtime started" in text and head_address is not None:
            return proc, head_address
        time.sleep(0.2)
    raise RuntimeError(f"ray start ({ip}) exited {proc.returncode}:\n{log.read_text()}")


def _stop(proc: subprocess.Popen, ip: str | None) -> None:
    """Kill one node at once, as a lost machine goes: its ``ray start`` process group, then, for a
    device node (``ip`` given: an address nothing else here uses), every process whose command
    line names its address (raylet, workers)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if ip is not None:
        subprocess.run(["pkill", "-9", "-f", rf"node.ip.address={re.escape(ip)}( |$)"], check=False)


#: The device nodes' loopback addresses (the head, without devices, is 127.0.0.1).
NODE_IPS = ("127.0.0.2", "127.0.0.3")


@pytest.fixture
def two_nodes() -> Iterator[tuple[str, dict[str, subprocess.Popen]]]:
    """A Ray cluster on this machine: a head without devices (as a cluster's head often is) and two
    nodes with one ``rpeg_device`` each; yields the head's GCS address and the device nodes'
    ``ray start`` processes by address."""
    temp = tempfile.mkdtemp(prefix="rpeg-ray-", dir="/tmp")  # short: Ray's socket paths must fit
    nodes: dict[str, subprocess.Popen] = {}
    try:
        nodes["127.0.0.1"], address = _start_node(temp, "127.0.0.1", head_address=None, devices=0)
        for ip in NODE_IPS:
            nodes[ip], _ = _start_node(temp, ip, head_address=address, devices=1)
        yield address, {ip: nodes[ip] for ip in NODE_IPS}
    finally:
        for ip, proc in reversed(nodes.items()):
            _stop(proc, ip if ip in NODE_IPS else None)
        # anything of this cluster still running (its sockets and logs are under temp)
        subprocess.run(["pkill", "-9", "-f", temp], check=False)
        time.sleep(0.5)
        shutil.rmtree(temp, ignore_errors=True)


def test_a_two_node_plan_runs_on_two_ray_nodes_and_survives_losing_one(two_nodes, tmp_path):
    """GRPO (rule reward, no reference) on two nodes of one device each: generation replicated
    over both (DP = 2), training on the first. Once step 0 is done the second node and every
    process on it are killed: the run loses device 1 (a generation replica, whose weights the
    trainer still holds), replans on the surviving node and finishes there. The first segment's
    trace shows one Ray node per plan node."""
    address, device_nodes = two_nodes
    wl = Workload("grpo", {"actor": TOY}, 8, 4, 64, 64, reward="rule", kl_coef=0.0)
    table = {
        "actor_gen": ((0, 0, 0), (1, 2, 1), 2, 1, 1, 1),
        "actor_train": ((0, 0, 0), (1, 1, 1), 1, 1, 1, 1),
    }
    result = hand(wl, "1x2x1", table, (("actor", 0),))
    plan, trace_path = tmp_path / "plan.json", tmp_path / "trace.json"
    result.to_json(plan)
    cmd = [sys.executable, "-m", "rpeg.cli", "run", str(plan), "--steps", "3", "--on-worker-lost", "replan"]
    cmd += ["--address", address, "--trace", str(trace_path)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **_AUTH}
    )
    seen, placement = [], None
    try:
        for line in proc.stderr:  # the run reports its set-up, placement and steps on stderr
            seen.append(line)
            placement = placement or re.match(r"placement: plan node 0 on (\S+), plan node 1 on (\S+)$", line)
            if line.startswith("step 0 done"):
                break
        else:
            pytest.fail(
                f"rpeg run ended before its first step was done (exit {proc.wait()}): {''.join(seen)}"
            )
        assert placement and {placement[1], placement[2]} == set(NODE_IPS), "".join(seen)
        _stop(device_nodes[placement[2]], placement[2])  # plan node 1's Ray node, every process on it
        out, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    shown = "".join(seen) + err
    # exit 0: every segment's trace verified against its plan (rpeg run exits 1 on a problem)
    assert proc.returncode == 0, shown + out
    assert "recovered: lost device(s) [1] at step " in shown, shown
    first, *later = [trace_path, *sorted(tmp_path.glob("trace.seg*.json"))]
    first = Trace.from_json(first)
    assert first.status == "complete" and first.steps >= 1 and verify(first, result) == []
    # every worker of a plan node on one Ray node, the plan's two nodes on two
    ray_node = {}  # plan device -> the Ray node its workers ran on
    for group in first.groups.values():
        for rank in group["ranks"]:
            device = group["devices"][rank["rank"]]
            assert ray_node.setdefault(device, rank["node"]) == rank["node"]
    assert sorted(ray_node) == [0, 1], "the plan uses both devices"
    assert ray_node[0] is not None and ray_node[0] != ray_node[1]
    # the steps after the loss on the replanned plan, on device 0 alone
    rest = [Trace.from_json(f) for f in later]
    assert first.steps + sum(t.steps for t in rest) == 3 and rest
    assert all(t.status == "complete" and all(r.devices == [0] for r in t.records) for t in rest)
