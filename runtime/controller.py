"""The controller: persistent worker groups on Ray and completion-driven dispatch (SPEC §11).

Placement: one placement group per cluster node with one bundle per device — ``{"GPU": 1}``
when the cluster has GPUs, otherwise ``{"rpeg_device": 1}``, a custom resource standing for a
reserved CPU slot (a local instance is started with as many as the plan has devices). The
worker of rank ``r`` of a group runs in the bundle of the group's ``r``-th device, so two groups
that share devices share bundles, exactly as the plan time-shares them.

Dispatch is Algorithm 2 of the RPEG paper over the lowered DAG: a node becomes *ready* when all
its predecessors completed, and *starts* when its resource set (the devices it reserves) is
free; ready nodes are ordered by RL step, then COMM/RESHARD before OP, then topological order;
calls are submitted asynchronously and the controller sleeps in ``ray.wait`` until some node
completes. Containers and published weight versions are released as soon as no remaining node
reads them.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..ir.cluster import mask_devices
from ..ir.lower import COMM, OP, RESHARD
from ..ir.types import Role
from .binding import Binding, GroupSpec
from .trace import TraceRecord

__all__ = ["Controller", "RunError"]

_KIND = {OP: "op", COMM: "comm", RESHARD: "reshard"}


#: Worker slots per device: each worker reserves ``1/WORKERS_PER_DEVICE`` of its device's bundle,
#: so a plan (at most half the slots) and a transition target fit side by side.
WORKERS_PER_DEVICE = 32


class RunError(RuntimeError):
    """A node failed: names the node, its step and the worker that raised or died."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class _Actor:
    """Ray actor shell around :class:`~rpeg.runtime.worker.Worker`: created cheaply, then
    :meth:`setup` joins the group's process group (all ranks at once)."""

    def __init__(self) -> None:
        self.worker = None

    def address(self) -> str:
        import ray

        return f"{ray.util.get_node_ip_address()}:{_free_port()}"

    def setup(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        from .worker import Worker

        self.worker = Worker(*args, **kwargs)
        return self.worker.info()

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.worker, method)(*args)

    def op(self, node: dict[str, Any], inputs: dict[str, list]) -> tuple[Any, Any, Any]:
        return self.worker.op(node, inputs)


@dataclass
class _Node:
    id: int
    kind: int
    vertex: int
    source: int
    step: int
    phase: int
    devices: tuple[int, ...]
    group: int
    role: str  # "op" | "data" | "weights"
    reads: list[tuple[int, int]] = field(default_factory=list)  # artifacts (step, vertex) it reads
    version: int = 0
    model: str = ""


class Controller:
    """Start worker groups for a :class:`Binding` and execute its DAG.

    Parameters
    ----------
    binding
        The plan bound to groups.
    config
        ``RunConfig``-like object with ``seed``, ``rl``, ``backend``, ``use_gpu``,
        ``devices_per_node``, ``checkpoint_dir``, ``fail_at`` and ``step_offset``.
    progress
        Called with ``(event, payload)`` for ``"setup"``, ``"node"`` and ``"step"`` events.
    """

    def __init__(self, binding: Binding, config: Any, progress: Callable[[str, dict], None] | None = None):
        self.b = binding
        self.cfg = config
        self.progress = progress or (lambda event, payload: None)
        self.actors: dict[int, list[Any]] = {}
        self.placement: list[Any] = []
        self.owns_placement = True
        self.per_node = 0
        self.device_base = 0
        self.failure: dict[str, Any] | None = None  # the first failed node, see _check
        self.in_flight: list[Any] = []  # refs still running when execution stopped
        self.dead: set[tuple[int, int]] = set()  # (gid, rank) of workers known lost
        self.initial_pubs: dict[tuple[str, int], list] = {}  # publications of versions < 0
        self.records: list[TraceRecord] = []
        self.group_info: dict[str, dict[str, Any]] = {}
        self.overhead_s = 0.0
        self.setup_s = 0.0
        self.wall_s = 0.0
        self.rewards: dict[int, list[float]] = {}
        self.losses: dict[int, dict[str, float]] = {}
        self.t0 = 0.0

    # ------------------------------------------------------------------ setup
    def start(
        self, placement: list[Any] | None = None, per_node: int | None = None, device_base: int = 0
    ) -> None:
        """Reserve devices with placement groups and start every group's workers.

        Parameters
        ----------
        placement, per_node
            Placement groups (and devices per group) of a running controller to start in instead:
            a transition target starts beside the current plan's workers on the same devices.
        device_base
            Physical device of the plan's device 0 (a plan for a smaller pool after a device
            loss runs on devices ``device_base ..``; the trace keeps the plan's device ids).
        """
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        t0 = time.perf_counter()
        cluster = self.b.result.cluster
        n = cluster.num_devices
        if per_node is None:
            per_node = self.cfg.devices_per_node or cluster.gpus_per_node
            if n % per_node:
                raise ValueError(f"devices_per_node={per_node} does not divide the plan's {n} devices")
        self.per_node, self.device_base = per_node, device_base
        resource = "GPU" if self.cfg.use_gpu else "rpeg_device"
        available = ray.cluster_resources().get(resource, 0)
        if available < n:
            raise ValueError(
                f"the Ray cluster offers {available:g} {resource!r} resources but the plan needs {n} devices "
                f"(cluster {cluster.shape_str}); start Ray with "
                f"--resources='{{\"{resource}\": {n}}}' or run without an address"
            )
        if placement is not None:
            pgs = list(placement)
            self.owns_placement = False
        else:
            pgs = [
                placement_group([{resource: 1}] * per_node, strategy="STRICT_PACK")
                for _ in range(n // per_node)
            ]
            ray.get([pg.ready() for pg in pgs], timeout=120)
            self.owns_placement = True
        self.placement = pgs
        sharing = [0] * n
        for g in self.b.groups:
            for d in g.devices:
                sharing[d] += 1
        if max(sharing) > WORKERS_PER_DEVICE // 2:
            raise ValueError(
                f"the plan puts {max(sharing)} workers on device {sharing.index(max(sharing))}; at most "
                f"{WORKERS_PER_DEVICE // 2} per device (half of a device's slots, the other half is for a "
                "transition target)"
            )
        remote = ray.remote(_Actor)
        for g in self.b.groups:
            actors = []
            for dev in g.devices:
                phys = dev + device_base
                opts: dict[str, Any] = {
                    "scheduling_strategy": PlacementGroupSchedulingStrategy(
                        pgs[phys // per_node], placement_group_bundle_index=phys % per_node
                    ),
                    "num_cpus": 0,
                    "max_restarts": 0,
                }
                if self.cfg.use_gpu:
                    opts["num_gpus"] = 1.0 / WORKERS_PER_DEVICE
                else:
                    opts["resources"] = {"rpeg_device": 1.0 / WORKERS_PER_DEVICE}
                actors.append(remote.options(**opts).remote())
            self.actors[g.gid] = actors
        setups = []
        for g in self.b.groups:
            master = ray.get(self.actors[g.gid][0].address.remote())
            for rank, a in enumerate(self.actors[g.gid]):
                fail = None
                if self.cfg.fail_at and self.cfg.fail_at[0] == g.worker(rank):
                    fail = tuple(self.cfg.fail_at[1:])
                setups.append(
                    (
                        g,
                        rank,
                        a.setup.remote(
                            g,
                            rank,
                            master,
                            self.b.shape,
                            self.cfg.rl,
                            self.cfg.seed,
                            "nccl" if self.cfg.use_gpu else "gloo",
                            fail,
                            self.cfg.step_offset,
                            bool(getattr(self.cfg, "recover", False)),
                        ),
                    )
                )
        for g, rank, ref in setups:
            info = self._get(ref, f"setup of worker {g.worker(rank)}")
            entry = self.group_info.setdefault(
                f"g{g.gid}",
                {
                    "model": g.model,
                    "vertices": list(g.vertices),
                    "devices": list(g.devices),
                    "layout": g.layout(),
                    "workers": g.workers(),
                    "spec": {"layers": g.spec.layers, "hidden": g.spec.hidden, "heads": g.spec.heads},
                    "ranks": [],
                },
            )
            entry["ranks"].append({"rank": rank, **{k: v for k, v in info.items() if k != "coords"}})
        self.setup_s = time.perf_counter() - t0

    def _get(self, ref: Any, what: str) -> Any:
        import ray

        try:
            return ray.get(ref)
        except Exception as exc:  # RayTaskError / RayActorError: name what failed
            raise RunError(f"{what} failed: {_cause(exc)}") from exc

    # ------------------------------------------------------------------ the DAG
    def _nodes(self) -> list[_Node]:
        b = self.b
        eg = b.exec_graph
        g = b.graph
        verts = g.vertices
        data_in = {
            v: [g.index[e.src] for e in g.data_edges if e.dst == verts[v].name] for v in range(len(verts))
        }
        nodes = []
        for i in range(len(eg)):
            v, k, ph = eg.vertex[i], eg.step[i], eg.phase[i]
            kind = eg.kind[i]
            src = eg.source[i]
            node = _Node(i, kind, v, src, k, ph, tuple(mask_devices(eg.mask[i])), b.group_of[v], "op")
            node.model = verts[v].model
            node.version = b.version(v, k)
            if kind == OP:
                node.reads = [(k, u) for u in data_in[v]]
            elif kind == RESHARD or verts[src].role is Role.TRAINING:
                node.role = "weights"
            else:
                node.role = "data"
                node.reads = [(k, src)]
            nodes.append(node)
        return nodes

    def execute(self) -> None:
        """Run every node of the DAG (Algorithm 2) and fill :attr:`records`."""
        import ray

        b = self.b
        eg = b.exec_graph
        verts = b.graph.vertices
        nodes = self._nodes()
        n = len(nodes)
        succ: list[list[int]] = [[] for _ in range(n)]
        indeg = [len(p) for p in eg.preds]
        for i, ps in enumerate(eg.preds):
            for p in ps:
                succ[p].append(i)
        # readers per artifact and per weight version, for release
        readers: dict[tuple[int, int], int] = {}
        for nd in nodes:
            for key in nd.reads:
                readers[key] = readers.get(key, 0) + 1
        version_readers: dict[tuple[str, int], int] = {}
        for nd in nodes:
            if nd.role == "weights":
                key = (nd.model, nd.version)
                version_readers[key] = version_readers.get(key, 0) + 1
        publishes = {m for m, _ in version_readers}
        self._publishes = publishes
        self._wait_refs: dict[int, list] = {}
        tau = b.graph.staleness
        serves = {
            g.gid: any(verts[b.graph.index[name]].role is not Role.TRAINING for name in g.vertices)
            for g in b.groups
        }
        artifacts: dict[tuple[int, int], dict[int, list]] = {}
        pubs: dict[tuple[str, int], list] = {}
        # versions before this run (a transition target of an asynchronous plan), then version 0 of
        # every model some transfer reads from its training group's initial weights
        pubs.update(self.initial_pubs)
        for g in b.groups:
            if g.trains and (g.model, 0) in version_readers:
                pubs[(g.model, 0)] = [a.call.remote("publish") for a in self.actors[g.gid]]

        ready: list[tuple[int, int, int]] = []
        for i in range(n):
            if indeg[i] == 0:
                heapq.heappush(ready, (nodes[i].step, 0 if nodes[i].kind != OP else 1, i))
        busy: set[int] = set()
        running: dict[Any, int] = {}
        pending: dict[int, list] = {}
        extra: dict[int, list] = {}
        starts: dict[int, float] = {}
        done = 0
        self.t0 = t_run = time.perf_counter()
        waited = 0.0
        while done < n:
            # start every ready node whose devices are free, in priority order
            kept = []
            while ready:
                item = heapq.heappop(ready)
                nd = nodes[item[2]]
                if busy.intersection(nd.devices):
                    kept.append(item)
                    continue
                if nd.role == "weights" and (nd.model, nd.version) not in pubs:
                    # the lowered graph orders a weight transfer after its consumer's inputs, not
                    # after the training that produces the version it carries (e.g. a RESHARD into
                    # training at step k with τ > 0): wait for that publication
                    kept.append(item)
                    continue
                busy.update(nd.devices)
                starts[nd.id] = time.perf_counter() - t_run
                refs, more = self._submit(nd, artifacts, pubs, publishes, serves, tau)
                pending[nd.id] = list(refs)
                self._wait_refs[nd.id] = list(refs)
                extra[nd.id] = more
                for r in refs:
                    running[r] = nd.id
            for item in kept:
                heapq.heappush(ready, item)
            if not running:
                raise RunError("dispatch deadlock: no node running and none can start (a bug in the binding)")
            w0 = time.perf_counter()
            finished, _ = ray.wait(list(running), num_returns=1)
            waited += time.perf_counter() - w0
            for r in finished:
                i = running.pop(r)
                try:
                    self._check(nodes[i], r)
                except RunError:
                    self.wall_s = time.perf_counter() - t_run
                    self.overhead_s = self.wall_s - waited
                    raise
                pending[i].remove(r)
                if pending[i]:
                    continue
                nd = nodes[i]
                end = time.perf_counter() - t_run
                self._complete(nd, starts[i], end, extra[i], artifacts, pubs)
                busy.difference_update(nd.devices)
                done += 1
                for key in nd.reads:
                    readers[key] -= 1
                    if readers[key] == 0:
                        artifacts.pop(key, None)
                if nd.role == "weights":
                    key = (nd.model, nd.version)
                    version_readers[key] -= 1
                    if version_readers[key] == 0:
                        pubs.pop(key, None)
                for s in succ[i]:
                    indeg[s] -= 1
                    if indeg[s] == 0:
                        heapq.heappush(ready, (nodes[s].step, 0 if nodes[s].kind != OP else 1, s))
        total = time.perf_counter() - t_run
        self.wall_s = total
        self.overhead_s = total - waited

    def _submit(self, nd: _Node, artifacts, pubs, publishes, serves, tau) -> tuple[list, list]:
        """Submit node ``nd`` to its group's workers; returns (refs to wait on, other refs)."""
        b = self.b
        actors = self.actors[nd.group]
        verts = b.graph.vertices
        vname = verts[nd.vertex].name
        if nd.role == "data":
            src = verts[nd.source].name
            phases = artifacts.get((nd.step, nd.source), {})
            refs = (
                phases.get(nd.phase, []) if nd.phase > 0 else [r for p in sorted(phases) for r in phases[p]]
            )
            key = (vname, nd.step, src, nd.phase)
            out = [a.call.remote("fetch", key, refs) for a in actors]
            return out, []
        if nd.role == "weights":
            src_refs = pubs.get((nd.model, nd.version))
            if src_refs is None:
                raise RunError(
                    f"node {nd.id} ({_KIND[nd.kind]} → {vname} step {nd.step}) needs version {nd.version} "
                    f"of {nd.model}, which no group published"
                )
            out = [a.call.remote("install", src_refs, nd.version) for a in actors]
            return out, []
        vert = verts[nd.vertex]
        group = b.groups[nd.group]
        inputs: dict[str, list] = {}
        for k, u in nd.reads:
            phases = artifacts.get((k, u), {})
            own_phase = nd.phase if nd.phase > 0 and any(p > 0 for p in phases) else None
            inputs[verts[u].name] = (
                phases.get(own_phase, []) if own_phase else [r for p in sorted(phases) for r in phases[p]]
            )
        outs = [
            c for c in vert.outputs if not c.startswith("W_") and b.graph.containers[c].weights_of is None
        ]
        keep = int(getattr(self.cfg, "keep_versions", 0))  # versions a later plan of the run may read
        desc = {
            "vertex": vname,
            "role": vert.role.value,
            "step": nd.step,
            "phase": nd.phase,
            "version": nd.version,
            "output": outs[0] if outs else "",
            "algorithm": b.graph.algorithm,
            "publish": vert.role is Role.TRAINING and vert.model in publishes,
            "keep_previous": vert.role is Role.TRAINING
            and ((serves[group.gid] and tau.get(vert.model, 0) > 0) or keep > 0),
            "tau": tau.get(vert.model, 0),
            "keep": max(tau.get(vert.model, 0), keep),
        }
        if vert.role is Role.TRAINING and self.cfg.checkpoint_dir:
            desc["save"] = os.path.join(self.cfg.checkpoint_dir, f"step{nd.step:05d}")
        metas, datas, publs = [], [], []
        for a in actors:
            m, d, p = a.op.options(num_returns=3).remote(desc, inputs)
            metas.append(m)
            datas.append(d)
            publs.append(p)
        return metas, [datas, publs]

    def _complete(self, nd: _Node, start: float, end: float, extra: list, artifacts, pubs) -> None:
        import ray

        b = self.b
        verts = b.graph.vertices
        group: GroupSpec = b.groups[nd.group]
        vname = verts[nd.vertex].name
        try:
            metas = ray.get(self._wait_refs.pop(nd.id))
        except Exception as exc:  # normally caught per rank by _check first
            raise RunError(f"{self._describe(nd)} failed on group g{group.gid}: {_cause(exc)}") from exc
        consumed: dict[str, int] = {}
        produced: dict[str, int] = {}
        nbytes = 0
        if nd.kind == OP:
            datas, publs = extra
            artifacts.setdefault((nd.step, nd.vertex), {})[nd.phase] = datas
            consumed = {nd.model: metas[0]["version_used"]}
            if verts[nd.vertex].role is Role.TRAINING:
                produced = {nd.model: metas[0]["version"]}
                if nd.model in self._publishes:
                    pubs[(nd.model, metas[0]["version"])] = publs
                losses = [m["loss"] for m in metas if m.get("loss") is not None]
                if losses:
                    self.losses.setdefault(nd.step, {})[nd.model] = float(sum(losses))
            for m in metas:
                if "reward_sum" in m:
                    self.rewards.setdefault(nd.step, []).append((m["reward_sum"], m["reward_count"]))
        else:
            nbytes = max(int(m["bytes"]) for m in metas)
            if nd.role == "weights":
                consumed = {nd.model: int(metas[0]["version"])}
        self.records.append(
            TraceRecord(
                node=nd.id,
                kind=_KIND[nd.kind],
                vertex=vname,
                source=verts[nd.source].name if nd.kind != OP else None,
                step=nd.step,
                phase=nd.phase,
                workers=group.workers(),
                devices=list(nd.devices),
                layout=group.layout(),
                start=start,
                end=end,
                versions_consumed=consumed,
                version_produced=produced,
                bytes=nbytes,
                worker_time=max(float(m["worker_time"]) for m in metas),
            )
        )
        self.progress("node", {"record": self.records[-1]})

    def _describe(self, nd: _Node) -> str:
        verts = self.b.graph.vertices
        what = f"node {nd.id} ({_KIND[nd.kind]} "
        if nd.kind != OP:
            what += f"{verts[nd.source].name} → "
        what += f"{verts[nd.vertex].name} step {nd.step}"
        return what + (f" phase {nd.phase})" if nd.phase else ")")

    def _check(self, nd: _Node, ref: Any) -> None:
        """Raise :class:`RunError` naming node, step and worker if ``ref`` holds an error (a worker
        that raised or died); the other ranks of the group may be stuck in a collective, so the
        run stops here instead of waiting for them. :attr:`failure` keeps what failed, with
        ``lost = True`` when the worker's process is gone (a device loss) rather than raised."""
        import ray

        try:
            ray.get(ref)
        except Exception as exc:
            group = self.b.groups[nd.group]
            rank = self._wait_refs[nd.id].index(ref)
            lost = isinstance(exc, ray.exceptions.RayActorError)
            self.failure = {
                "lost": lost,
                "gid": group.gid,
                "rank": rank,
                "device": group.devices[rank],
                "step": nd.step,
                "vertex": self.b.graph.vertices[nd.vertex].name,
                "worker": group.worker(rank),
                "node": nd.id,
            }
            if lost:
                self.dead.add((group.gid, rank))
            self.in_flight = [r for refs in self._wait_refs.values() for r in refs if r is not ref]
            raise RunError(
                f"{self._describe(nd)} failed on worker {group.worker(rank)} "
                f"(device {group.devices[rank]}): {'worker process lost: ' if lost else ''}{_cause(exc)}"
            ) from exc

    def live_actors(self) -> list[tuple[int, int, Any]]:
        """``(gid, rank, actor)`` of every worker not known to be lost."""
        return [
            (g.gid, r, a)
            for g in self.b.groups
            for r, a in enumerate(self.actors[g.gid])
            if (g.gid, r) not in self.dead
        ]

    def final_weights(self) -> dict[str, dict[str, Any]]:
        """Full weights of every trained model, assembled from its training group's shards."""
        import ray

        from .parallel import assemble

        out = {}
        for g in self.b.groups:
            if g.trains:
                got = [x for x in ray.get([a.call.remote("publish") for a in self.actors[g.gid]]) if x]
                out[g.model] = assemble([(coords[1], pub) for coords, pub in got])
        return out

    def stop(self) -> None:
        """Kill the workers and release the placement groups (unless borrowed, see :meth:`start`)."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for actors in self.actors.values():
            for a in actors:
                with contextlib.suppress(Exception):  # already dead
                    ray.kill(a)
        for pg in self.placement if self.owns_placement else []:
            with contextlib.suppress(Exception):
                remove_placement_group(pg)
        self.actors.clear()
        self.placement = []


def _cause(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    tail = [line for line in text if line.strip()]
    for line in reversed(tail):
        if "Error" in line or "error" in line:
            return line.strip()
    return tail[-1].strip() if tail else type(exc).__name__
