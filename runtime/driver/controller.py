"""The controller: persistent worker groups on Ray and completion-driven dispatch (SPEC §11).

Placement: one placement group per cluster node with one bundle per device — ``{"GPU": 1}``
when the cluster has GPUs, otherwise ``{"rpeg_device": 1}``, a custom resource standing for a
reserved CPU slot (a local instance is started with as many as the plan has devices). Inside a
:class:`~rpeg.runtime.driver.pool.WorkerPool` on a one-node Ray instance the devices are one group
instead, which the pool keeps for plans of any node shape (their node boundaries are on the same
machine anyway). Each physical device is a *slot*, ``(placement group, bundle)``. One process
runs in the slot of each device the plan uses (:class:`~rpeg.runtime.worker.process.WorkerProcess`)
and holds every worker placed there: rank ``r`` of a group is a worker in the process of the
group's ``r``-th device, so two groups that share devices share processes, exactly as the plan
time-shares them. The processes form the run's ``torch.distributed`` world (one rank each, in
device order); every group's process groups are subgroups of it.

Dispatch is Algorithm 2 of the RPEG paper over the lowered DAG: a node becomes *ready* when all
its predecessors completed, and *starts* when its resource set (the devices it reserves) is
free; ready nodes are ordered by RL step, then COMM/RESHARD before OP, then topological order;
calls are submitted asynchronously and the controller sleeps in ``ray.wait`` until some node
completes. Containers and published weight versions are released as soon as no remaining node
reads them.

Every wait is progress-checked (:mod:`~rpeg.runtime.driver.liveness`): no fixed deadline; a worker
whose process is gone stops the run at once with a :class:`RunError` naming the node, its step,
the worker and its device; a run in which nothing arrives and no worker computes for the stall
window stops too. The world's rendezvous store is opened by its first process on a port the OS
picks.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...ir.cluster import mask_devices
from ...ir.lower import COMM, OP, RESHARD
from ...ir.types import Role
from ..binding import Binding, GroupSpec, recompute_note
from ..trace.checkpoint import step_dir_name
from ..trace.records import TraceRecord
from ..worker.process import TRANSITION_THREADS, WorkerProcess
from .group import Call, WorkerGroup
from .liveness import DEFAULT_STALL_S, Owner, RunError, Watchdog, cause
from .pool import active_pool, one_node

__all__ = ["Controller", "RunError"]

_KIND = {OP: "op", COMM: "comm", RESHARD: "reshard"}


#: Process slots per device: each device process reserves ``1/PROCESSES_PER_DEVICE`` of its
#: device's bundle, so that a transition target's processes start beside the current plan's (and
#: idle ones a :class:`~rpeg.runtime.driver.pool.WorkerPool` keeps beside both).
PROCESSES_PER_DEVICE = 32


def _engine_facts(metas: list[dict[str, Any]]) -> dict[str, Any]:
    """A node's rollout-engine facts: the one replica's, or ``{"replicas": [...]}``."""
    facts = [m["engine"] for m in metas if m.get("engine")]
    if len(facts) > 1:
        return {"replicas": facts}
    return facts[0] if facts else {}


def torch_timeout_s(stall_s: float) -> float:
    """Seconds torch.distributed may wait (rendezvous, collectives): the stall window, at least
    torch's own default of 30 minutes — the controller's progress checks come first."""
    return max(1800.0, float(stall_s))


@dataclass(frozen=True)
class InPlace:
    """A published version kept in place by the ranks of training group :attr:`gid` (instead of
    object refs): its readers are groups on the same devices and install it with
    ``install_in_place``; released with ``drop_published`` after the last one."""

    gid: int


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


@dataclass
class _Dispatch:
    """The state of one execution of the DAG (:meth:`Controller.execute`).

    ``ready`` is a heap of ``(step, 0 for COMM/RESHARD else 1, node)``; ``running`` maps each
    submitted call to its node and ``pending`` a node to the calls not yet returned; ``extra``
    holds an OP node's data and publication refs; ``artifacts`` maps ``(step, vertex)`` to
    its containers per phase and ``pubs`` ``(model, version)`` to a published version's refs,
    both released when their last reader completes (``readers``, ``version_readers``);
    ``starts`` are node start times and ``waited`` the seconds spent waiting, from ``t_run``.
    """

    nodes: list[_Node]
    succ: list[list[int]]
    indeg: list[int]
    readers: dict[tuple[int, int], int] = field(default_factory=dict)
    version_readers: dict[tuple[str, int], int] = field(default_factory=dict)
    serves: dict[int, bool] = field(default_factory=dict)
    artifacts: dict[tuple[int, int], dict[int, list]] = field(default_factory=dict)
    pubs: dict[tuple[str, int], list] = field(default_factory=dict)
    ready: list[tuple[int, int, int]] = field(default_factory=list)
    busy: set[int] = field(default_factory=set)
    running: dict[Any, int] = field(default_factory=dict)
    pending: dict[int, list] = field(default_factory=dict)
    extra: dict[int, list] = field(default_factory=dict)
    starts: dict[int, float] = field(default_factory=dict)
    done: int = 0
    waited: float = 0.0
    t_run: float = 0.0


class Controller:
    """Start worker groups for a :class:`Binding` and execute its DAG.

    Parameters
    ----------
    binding
        The plan bound to groups.
    config
        ``RunConfig``-like object with ``seed``, ``rl``, ``backend``, ``use_gpu``,
        ``devices_per_node``, ``checkpoint_dir``, ``fail_at``, ``step_offset`` and ``stall_s``
        (the stall window of every wait, :mod:`~rpeg.runtime.driver.liveness`).
    progress
        Called with ``(event, payload)`` for ``"node"`` events (payload ``record``, the node's
        :class:`~rpeg.runtime.trace.records.TraceRecord`) and ``"step"`` events, when a step's last
        node completes (payload ``step``, the run's step number; ``seconds`` since the DAG
        started; ``reward``, the step's mean reward or ``None``).
    """

    def __init__(self, binding: Binding, config: Any, progress: Callable[[str, dict], None] | None = None):
        self.b = binding
        self.cfg = config
        self.progress = progress or (lambda event, payload: None)
        self.watch = Watchdog(float(getattr(config, "stall_s", DEFAULT_STALL_S)))
        self.groups: dict[int, WorkerGroup] = {}  # gid → the group's handle: every call to a worker
        self.node_ips: dict[tuple[int, int], str] = {}  # (gid, rank) → its Ray node's address
        self.owners: dict[tuple[int, int], Owner] = {}  # (gid, rank) → the worker
        self.ref_owner: dict[Any, Owner] = {}  # submitted node call → its worker
        self.placement: list[Any] = []  # the placement groups
        self.slots: list[tuple[Any, int]] = []  # physical device → (placement group, bundle)
        self.owns_placement = True
        self.device_base = 0
        self.failure: dict[str, Any] | None = None  # the first failed node, see _check
        self.in_flight: list[Any] = []  # refs still running when execution stopped
        self.dead: set[tuple[int, int]] = set()  # (gid, rank) of workers known lost
        self.initial_pubs: dict[tuple[str, int], list] = {}  # publications of versions < 0
        self.records: list[TraceRecord] = []
        self.group_info: dict[str, dict[str, Any]] = {}
        self.saved: dict[int, dict[str, dict[str, Any]]] = {}  # global step → checkpoint files
        self.on_saved: Callable[[Controller], None] | None = None  # called when a step's files are all there
        self.overhead_s = 0.0
        self.setup_s = 0.0
        self.wall_s = 0.0
        self.rewards: dict[int, list[float]] = {}
        self.losses: dict[int, dict[str, float]] = {}
        self.gaps: dict[int, float] = {}
        self.t0 = 0.0
        self.pool = active_pool()  # idle worker processes to start in, and to return them to
        self.procs: dict[int, Any] = {}  # plan device → its process (WorkerProcess actor)
        self.bundles: dict[int, tuple[Any, int]] = {}  # plan device → its (placement group, bundle)
        self.shape: tuple[str, int, int] = ("", 0, 0)  # (resource, bundles per group, groups)
        self.finished = False  # the DAG ran to its end (stop() may then pool the workers)

    @property
    def actors(self) -> dict[int, list[Any]]:
        """gid → the group's actors in rank order (held by :attr:`groups`)."""
        return {gid: grp.actors for gid, grp in self.groups.items()}

    # ------------------------------------------------------------------ setup
    def start(self, beside: Controller | None = None, device_base: int = 0) -> None:
        """Reserve devices with placement groups and start every group's workers.

        Parameters
        ----------
        beside
            A running controller whose placement groups (and slots) to start in instead: a
            transition target starts beside the current plan's workers on the same devices.
        device_base
            Physical device of the plan's device 0 (a plan for a smaller pool after a device
            loss runs on devices ``device_base ..``; the trace keeps the plan's device ids).
        """
        t0 = time.perf_counter()
        self._reserve(beside, device_base)
        self._check_sharing()
        self._spawn_actors()
        # every process answers first (rank 0 opening its group's store on a port the OS picks),
        # then all ranks rendezvous at once
        torch_s = torch_timeout_s(self.watch.stall_s)
        master = self._hello(torch_s)
        self._setup_groups(master, torch_s)
        self.setup_s = time.perf_counter() - t0

    def _reserve(self, beside: Controller | None, device_base: int) -> None:
        """Check the Ray cluster offers the plan's devices and set :attr:`placement` and
        :attr:`slots`: those of ``beside``, or a set the active pool kept, or new ``STRICT_PACK``
        groups — one per node of ``devices_per_node`` bundles, or, for a pool on a one-node
        instance, one group of every device (which the pool keeps for plans of any node shape)
        — waited for by progress."""
        import ray
        from ray.util.placement_group import placement_group

        cluster = self.b.result.cluster
        n = cluster.num_devices
        self.device_base = device_base
        resource = "GPU" if self.cfg.use_gpu else "rpeg_device"
        available = ray.cluster_resources().get(resource, 0)
        if available < n:
            raise ValueError(
                f"the Ray cluster offers {available:g} {resource!r} resources but the plan needs {n} devices "
                f"(cluster {cluster.shape_str}); start Ray with "
                f"--resources='{{\"{resource}\": {n}}}' or run without an address"
            )
        if beside is not None:
            self.placement, self.slots, self.shape = list(beside.placement), list(beside.slots), beside.shape
            self.owns_placement = False
            return
        self.owns_placement = True
        per_node = self.cfg.devices_per_node or cluster.gpus_per_node
        if n % per_node:
            raise ValueError(f"devices_per_node={per_node} does not divide the plan's {n} devices")
        if self.pool is not None and (kept := self.pool.take_placement(resource, per_node, n)):
            self.placement, self.slots, self.shape = kept
            return
        if self.pool is not None and one_node():
            per_node = n  # one group: the pool can lend it to a plan of any node shape
        pgs = [
            placement_group([{resource: 1}] * per_node, strategy="STRICT_PACK") for _ in range(n // per_node)
        ]
        self.placement = pgs  # released by stop() even if the reservation never completes
        self.watch.wait_ready([pg.ready() for pg in pgs], f"reserving {n} devices (placement groups)")
        self.slots = [(pgs[d // per_node], d % per_node) for d in range(n)]
        self.shape = (resource, per_node, len(pgs))

    def _check_sharing(self) -> None:
        """Refuse a plan with two ranks of a group on one device, or more workers on one device
        than its process's transition threads (:data:`~rpeg.runtime.worker.process.TRANSITION_THREADS`:
        a transition calls every worker of a process at once)."""
        sharing = [0] * self.b.result.cluster.num_devices
        for g in self.b.groups:
            if len(set(g.devices)) != len(g.devices):
                raise ValueError(f"group g{g.gid} places two of its ranks on one device: {list(g.devices)}")
            for d in g.devices:
                sharing[d] += 1
        if max(sharing) > TRANSITION_THREADS:
            raise ValueError(
                f"the plan puts {max(sharing)} workers on device {sharing.index(max(sharing))}; at most "
                f"{TRANSITION_THREADS} per device (a device's process serves a transition's calls to all "
                "of them at once)"
            )

    def _spawn_actors(self) -> None:
        """One process per device the plan uses, in the bundle of its physical device (``device +
        device_base``), reserving ``1/PROCESSES_PER_DEVICE`` of it — an idle process of that bundle
        from the active :class:`~rpeg.runtime.driver.pool.WorkerPool` when there is one; fills
        :attr:`procs`, :attr:`bundles`, :attr:`owners` and :attr:`groups` (every rank's actor is
        its device's process)."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        remote = ray.remote(concurrency_groups={"transition": TRANSITION_THREADS})(WorkerProcess)
        for dev in sorted({d for g in self.b.groups for d in g.devices}):
            pg, bundle = self.slots[dev + self.device_base]
            actor = self.pool.take_worker(pg, bundle) if self.pool is not None else None
            if actor is None:
                opts: dict[str, Any] = {
                    "scheduling_strategy": PlacementGroupSchedulingStrategy(
                        pg, placement_group_bundle_index=bundle
                    ),
                    "num_cpus": 0,
                    "max_restarts": 0,
                }
                if self.cfg.use_gpu:
                    opts["num_gpus"] = 1.0 / PROCESSES_PER_DEVICE
                else:
                    opts["resources"] = {"rpeg_device": 1.0 / PROCESSES_PER_DEVICE}
                actor = remote.options(**opts).remote()
            self.procs[dev], self.bundles[dev] = actor, (pg, bundle)
        for g in self.b.groups:
            for rank, dev in enumerate(g.devices):
                self.owners[(g.gid, rank)] = Owner(g.worker(rank), dev, self.procs[dev], g.gid, rank)
            owners = [self.owners[(g.gid, r)] for r in range(g.size)]
            self.groups[g.gid] = WorkerGroup(g, [self.procs[d] for d in g.devices], owners, self.dead)

    def _on_device(self, dev: int) -> list[Owner]:
        """The workers placed on plan device ``dev``, in gid order."""
        return [o for key, o in sorted(self.owners.items()) if o.device == dev]

    def _hello(self, torch_s: float) -> str:
        """Every process answers (each of its workers registered with the watchdog by the
        process's ``pid`` and ``host``); the first also opens the world's store. Returns the
        store's address."""
        devices = sorted(self.procs)
        hellos = {
            self.procs[dev].hello.remote(len(devices) if i == 0 else 0, torch_s): dev
            for i, dev in enumerate(devices)
        }
        answers = self.watch.get_all(
            list(hellos), lambda ref: self._on_device(hellos[ref])[0], "starting the worker processes"
        )
        master = ""
        for dev, ans in zip(hellos.values(), answers):
            for owner in self._on_device(dev):
                self.watch.register(owner, ans["pid"], ans["host"])
                self.node_ips[(owner.gid, owner.rank)] = ans["node_ip"]
            master = ans["master"] or master
        return master

    def _setup_groups(self, master: str, torch_s: float) -> None:
        """Every process joins the run's world and builds its device's workers (all processes at
        once; every group's process groups are subgroups of the world,
        :func:`~rpeg.runtime.worker.parallel.plan_groups`); fills :attr:`group_info` for the
        trace."""
        devices = sorted(self.procs)
        world_rank = {dev: i for i, dev in enumerate(devices)}
        layouts = [
            (g.gid, [world_rank[d] for d in g.devices], g.replicas, g.pp, g.tp, g.cp, g.ep)
            for g in self.b.groups
        ]
        backend = "nccl" if self.cfg.use_gpu else "gloo"
        setups: dict[Any, int] = {}
        for dev in devices:
            local = []
            for owner in self._on_device(dev):
                g = self.b.groups[owner.gid]
                fail = None
                if self.cfg.fail_at and self.cfg.fail_at[0] == owner.worker:
                    fail = tuple(self.cfg.fail_at[1:])
                args = (
                    self.b.shape,
                    self.cfg.rl,
                    self.cfg.seed,
                    backend,
                    fail,
                    self.cfg.step_offset,
                    bool(getattr(self.cfg, "recover", False)),
                )
                local.append((g, owner.rank, args))
            ref = self.procs[dev].setup.remote(
                master,
                (world_rank[dev], len(devices)),
                layouts,
                local,
                backend,
                timeout_s=torch_s,
                rollout_engine=getattr(self.cfg, "rollout_engine", "torch"),
            )
            setups[ref] = dev
        answers = self.watch.get_all(
            list(setups), lambda ref: self._on_device(setups[ref])[0], "setting up the worker groups"
        )
        infos = {}
        for dev, per_gid in zip(setups.values(), answers):
            for gid, info in per_gid.items():
                infos[(gid, self.b.groups[gid].devices.index(dev))] = info
        for g in self.b.groups:
            for rank in range(g.size):
                info = infos[(g.gid, rank)]
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
                if g.trains and "recompute" not in entry:  # the plan's recomputation mode, as run
                    entry["recompute"] = {
                        "planned": g.recompute,
                        "run": g.recompute_run,
                        "note": recompute_note(g.recompute),
                    }
                entry["ranks"].append({"rank": rank, **{k: v for k, v in info.items() if k != "coords"}})

    def workers(self) -> dict[str, dict[str, Any]]:
        """Worker id → ``{"pid", "host", "node_ip", "device"}`` of every started worker."""
        return {
            o.worker: {
                "pid": o.pid,
                "host": o.host,
                "node_ip": self.node_ips.get((o.gid, o.rank)),
                "device": o.device,
            }
            for o in self.owners.values()
        }

    def placement_nodes(self) -> list[list[str]]:
        """Per plan node, the addresses of the Ray nodes its workers run on (one each, with one
        Ray node per plan node; a plan node whose devices hold no worker has none)."""
        per_node = self.b.result.cluster.gpus_per_node
        nodes: list[set[str]] = [set() for _ in range(self.b.result.cluster.num_devices // per_node)]
        for key, owner in self.owners.items():
            if key in self.node_ips:
                nodes[owner.device // per_node].add(self.node_ips[key])
        return [sorted(ips) for ips in nodes]

    def get(self, calls: list[tuple[tuple[int, int], Any]], what: str) -> list[Any]:
        """Results of ``(worker key (gid, rank), ref)`` calls, waited for by progress
        (:meth:`~rpeg.runtime.driver.liveness.Watchdog.get_all`); a failure is a :class:`RunError`
        naming ``what``, the worker and its device."""
        owner = {ref: self.owners[key] for key, ref in calls}
        return self.watch.get_all([ref for _, ref in calls], owner.__getitem__, what)

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
        """Run every node of the DAG (Algorithm 2) and fill :attr:`records`.

        A node is ready when all its predecessors completed and starts when its devices are
        free (:meth:`_start_ready`); the controller then sleeps until some call returns
        (:meth:`_wait`) and completes the nodes whose every rank answered (:meth:`_arrived`).
        :attr:`wall_s` is the whole execution, :attr:`overhead_s` the part not spent waiting.
        """
        d = self._dispatch()
        while d.done < len(d.nodes):
            self._start_ready(d)
            if not d.running:
                raise RunError("dispatch deadlock: no node running and none can start (a bug in the binding)")
            finished, dead = self._wait(d)
            for r in [*dead, *finished]:
                self._arrived(d, r, dead=r in dead)
        self._timed(d)
        self.finished = True

    def _dispatch(self) -> _Dispatch:
        """The dispatch state of a fresh execution: successors and in-degrees, readers per
        artifact and per weight version (for release), the initial publications and the ready
        heap."""
        b = self.b
        eg = b.exec_graph
        verts = b.graph.vertices
        nodes = self._nodes()
        n = len(nodes)
        d = _Dispatch(nodes=nodes, succ=[[] for _ in range(n)], indeg=[len(p) for p in eg.preds])
        for i, ps in enumerate(eg.preds):
            for p in ps:
                d.succ[p].append(i)
        for nd in nodes:
            for key in nd.reads:
                d.readers[key] = d.readers.get(key, 0) + 1
        for nd in nodes:
            if nd.role == "weights":
                key = (nd.model, nd.version)
                d.version_readers[key] = d.version_readers.get(key, 0) + 1
        self._publishes = {m for m, _ in d.version_readers}
        self._in_place = self._in_place_models(nodes, getattr(self.cfg, "weight_handover", "auto"))
        self._wait_refs: dict[int, list] = {}
        self._left_in_step = Counter(nd.step for nd in nodes)  # nodes not completed, per step
        d.serves = {
            g.gid: any(verts[b.graph.index[name]].role is not Role.TRAINING for name in g.vertices)
            for g in b.groups
        }
        # versions before this run (a transition target of an asynchronous plan), then version 0 of
        # every model some transfer reads from its training group's initial weights
        d.pubs.update(self.initial_pubs)
        for g in b.groups:
            if g.trains and (g.model, 0) in d.version_readers:
                if g.model in self._in_place:  # kept in the trainer's processes; a failure is named here
                    self.get(self.groups[g.gid].all("publish", True), f"keeping {g.model} version 0 in place")
                    d.pubs[(g.model, 0)] = InPlace(g.gid)
                else:
                    d.pubs[(g.model, 0)] = self.groups[g.gid].publish()
        for i in range(n):
            if d.indeg[i] == 0:
                heapq.heappush(d.ready, (nodes[i].step, 0 if nodes[i].kind != OP else 1, i))
        self.t0 = d.t_run = time.perf_counter()
        return d

    def _in_place_models(self, nodes: list[_Node], handover: str) -> dict[str, int]:
        """Model → its training group's gid, for each model whose versions this run hands over in
        place (:class:`InPlace`; ``handover`` is :attr:`~rpeg.runtime.config.RunConfig.weight_handover`).

        A model qualifies when every transfer of a version this run produces goes to a group on
        exactly its training group's devices (colocated roles, SPEC §14.4): every process of the
        trainer then hosts a rank of each reader, whose install meets the trainer's ranks in every
        process. With ``"auto"`` the trainer must also need no exchange between processes (no
        pipeline or tensor parallelism: every device keeps the whole model), or run on GPUs. A
        transfer of a version an earlier plan produced (``initial_pubs``) reads the object store
        and does not count.
        """
        if handover == "store":
            return {}
        out: dict[str, int] = {}
        for g in self.b.groups:
            if not g.trains:
                continue
            if handover == "auto" and g.pp * g.tp > 1 and not getattr(self.cfg, "use_gpu", False):
                continue
            if g.ep > 1:  # an expert-parallel replica holds only its experts: no whole model per device
                continue
            reads = [
                nd
                for nd in nodes
                if nd.role == "weights"
                and nd.model == g.model
                and (g.model, nd.version) not in self.initial_pubs
            ]
            if reads and all(set(self.b.groups[nd.group].devices) == set(g.devices) for nd in reads):
                out[g.model] = g.gid
        return out

    def _start_ready(self, d: _Dispatch) -> None:
        """Start every ready node whose devices are free, in priority order (step, then
        COMM/RESHARD before OP, then topological order)."""
        kept = []
        while d.ready:
            item = heapq.heappop(d.ready)
            nd = d.nodes[item[2]]
            if d.busy.intersection(nd.devices):
                kept.append(item)
                continue
            if nd.role == "weights" and (nd.model, nd.version) not in d.pubs:
                # the lowered graph orders a weight transfer after its consumer's inputs, not
                # after the training that produces the version it carries (e.g. a RESHARD into
                # training at step k with τ > 0): wait for that publication
                kept.append(item)
                continue
            d.busy.update(nd.devices)
            d.starts[nd.id] = time.perf_counter() - d.t_run
            calls, more = self._submit(
                nd, d.artifacts, d.pubs, self._publishes, d.serves, self.b.graph.staleness
            )
            refs = [r for _, r in calls]
            d.pending[nd.id] = list(refs)
            self._wait_refs[nd.id] = list(refs)
            d.extra[nd.id] = more
            for key, r in calls:
                d.running[r] = nd.id
                self.ref_owner[r] = self.owners[key]
        for item in kept:
            heapq.heappush(d.ready, item)

    def _wait(self, d: _Dispatch) -> tuple[list[Any], list[Any]]:
        """Sleep until some running call returns: ``(finished refs, refs of dead workers)``. A
        stall (nothing arrives, nobody computes) is a :class:`RunError` naming the first
        running node."""
        w0 = time.perf_counter()
        try:
            finished, dead = self.watch.wait_any(
                list(d.running), self.ref_owner.__getitem__, lambda: self._waiting_on(d.running, d.nodes)
            )
        except RunError as exc:  # stalled: nothing arrives, nobody computes
            first = d.nodes[min(d.running.values())]
            self._fail(first, None, lost=False)
            d.waited += time.perf_counter() - w0
            self._timed(d)
            exc.node, exc.step, exc.vertex = (
                first.id,
                first.step,
                self.b.graph.vertices[first.vertex].name,
            )
            raise
        d.waited += time.perf_counter() - w0
        return finished, dead

    def _arrived(self, d: _Dispatch, ref: Any, *, dead: bool) -> None:
        """One rank's call returned (or its worker died): check it (:meth:`_check`); when it was
        the node's last rank, complete the node, free its devices, release what no remaining
        node reads and make its successors ready."""
        i = d.running.pop(ref)
        try:
            self._check(d.nodes[i], ref, dead=dead)
        except RunError:
            self._timed(d)
            raise
        d.pending[i].remove(ref)
        if d.pending[i]:
            return
        nd = d.nodes[i]
        end = time.perf_counter() - d.t_run
        self._complete(nd, d.starts[i], end, d.extra[i], d.artifacts, d.pubs)
        d.busy.difference_update(nd.devices)
        d.done += 1
        for key in nd.reads:
            d.readers[key] -= 1
            if d.readers[key] == 0:
                d.artifacts.pop(key, None)
        if nd.role == "weights":
            key = (nd.model, nd.version)
            d.version_readers[key] -= 1
            if d.version_readers[key] == 0:
                pub = d.pubs.pop(key, None)
                if isinstance(pub, InPlace):  # after its installs, in every process's order
                    self.groups[pub.gid].all("drop_published", nd.version)
        for s in d.succ[i]:
            d.indeg[s] -= 1
            if d.indeg[s] == 0:
                heapq.heappush(d.ready, (d.nodes[s].step, 0 if d.nodes[s].kind != OP else 1, s))

    def _timed(self, d: _Dispatch) -> None:
        """Set :attr:`wall_s` (since the execution started) and :attr:`overhead_s` (not waiting)."""
        self.wall_s = time.perf_counter() - d.t_run
        self.overhead_s = self.wall_s - d.waited

    def _submit(self, nd: _Node, artifacts, pubs, publishes, serves, tau) -> tuple[list[Call], list]:
        """Submit node ``nd`` to its group's workers; returns (the calls to wait on, other refs)."""
        b = self.b
        grp = self.groups[nd.group]
        verts = b.graph.vertices
        vname = verts[nd.vertex].name
        if nd.role == "data":
            src = verts[nd.source].name
            phases = artifacts.get((nd.step, nd.source), {})
            refs = (
                phases.get(nd.phase, []) if nd.phase > 0 else [r for p in sorted(phases) for r in phases[p]]
            )
            key = (vname, nd.step, src, nd.phase)
            return grp.all("fetch", key, refs), []
        if nd.role == "weights":
            src_refs = pubs.get((nd.model, nd.version))
            if src_refs is None:
                raise RunError(
                    f"node {nd.id} ({_KIND[nd.kind]} → {vname} step {nd.step}) needs version {nd.version} "
                    f"of {nd.model}, which no group published"
                )
            if isinstance(src_refs, InPlace):
                return grp.all("install_in_place", src_refs.gid, nd.version), []
            return grp.install(src_refs, nd.version), []
        vert = verts[nd.vertex]
        group = b.groups[nd.group]
        inputs: dict[str, list] = {}
        for k, u in nd.reads:
            phases = artifacts.get((k, u), {})
            own_phase = nd.phase if nd.phase > 0 and any(p > 0 for p in phases) else None
            inputs[verts[u].name] = (
                phases.get(own_phase, []) if own_phase else [r for p in sorted(phases) for r in phases[p]]
            )
        keep = int(getattr(self.cfg, "keep_versions", 0))  # versions a later plan of the run may read
        tau_v = tau.get(vert.model, 0)
        training = vert.role is Role.TRAINING
        node = b.node_call(
            nd.vertex,
            nd.step,
            phase=nd.phase,
            version=nd.version,
            reads=[u for _, u in nd.reads],
            publish=training and vert.model in publishes,
            publish_in_place=training and vert.model in self._in_place,
            keep_previous=training and ((serves[group.gid] and tau_v > 0) or keep > 0),
            tau=tau_v,
            keep=max(tau_v, keep),
            save=(
                os.path.join(self.cfg.checkpoint_dir, step_dir_name(nd.step + self.cfg.step_offset))
                if training and self.cfg.checkpoint_dir
                else None
            ),
        )
        metas, datas, publs = grp.op(node, inputs)
        return [((nd.group, r), m) for r, m in enumerate(metas)], [datas, publs]

    def _complete(self, nd: _Node, start: float, end: float, extra: list, artifacts, pubs) -> None:
        import ray

        b = self.b
        verts = b.graph.vertices
        group: GroupSpec = b.groups[nd.group]
        vname = verts[nd.vertex].name
        try:
            metas = ray.get(self._wait_refs.pop(nd.id))  # every rank's result is there (see _check)
        except Exception as exc:  # normally caught per rank by _check first
            raise RunError(
                f"{self._describe(nd)} failed on group g{group.gid}: {cause(exc)}",
                node=nd.id,
                step=nd.step,
                vertex=vname,
            ) from exc
        consumed: dict[str, int] = {}
        produced: dict[str, int] = {}
        nbytes = 0
        if nd.kind == OP:
            datas, publs = extra
            artifacts.setdefault((nd.step, nd.vertex), {})[nd.phase] = datas
            consumed = {nd.model: metas[0]["version_used"]}
            if verts[nd.vertex].role is Role.TRAINING:
                produced = {nd.model: metas[0]["version"]}
                if nd.model in self._in_place:
                    pubs[(nd.model, metas[0]["version"])] = InPlace(nd.group)
                elif nd.model in self._publishes:
                    pubs[(nd.model, metas[0]["version"])] = publs
                gaps = [m["logprob_gap"] for m in metas if m.get("logprob_gap") is not None]
                if gaps:
                    self.gaps[nd.step] = max(self.gaps.get(nd.step, 0.0), *gaps)
                losses = [m["loss"] for m in metas if m.get("loss") is not None]
                if losses:
                    self.losses.setdefault(nd.step, {})[nd.model] = float(sum(losses))
                files = [m["checkpoint"] for m in metas if m.get("checkpoint")]
                if files:
                    self._saved(nd.step + self.cfg.step_offset, files)
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
                layout={**group.layout(), "mb": b.result.plan.choices[nd.vertex].strategy.mb},
                start=start,
                end=end,
                versions_consumed=consumed,
                version_produced=produced,
                bytes=nbytes,
                in_place_bytes=max((int(m.get("in_place_bytes", 0)) for m in metas), default=0),
                worker_time=max(float(m["worker_time"]) for m in metas),
                publish_s=max(float(m.get("publish_s", 0.0)) for m in metas),
                engine=_engine_facts(metas),
                memory={
                    w: float(m["memory_bytes"]) for w, m in zip(group.workers(), metas) if "memory_bytes" in m
                },
                memory_live={
                    w: float(m["memory_live_bytes"])
                    for w, m in zip(group.workers(), metas)
                    if "memory_live_bytes" in m
                },
            )
        )
        self.progress("node", {"record": self.records[-1]})
        self._left_in_step[nd.step] -= 1
        if self._left_in_step[nd.step] == 0:  # the step's last node
            parts = self.rewards.get(nd.step, [])
            count = sum(c for _, c in parts)
            reward = sum(r for r, _ in parts) / count if count else None
            self.progress(
                "step",
                {
                    "step": nd.step + int(getattr(self.cfg, "step_offset", 0)),
                    "seconds": end,
                    "reward": reward,
                },
            )

    def _saved(self, global_step: int, files: list[dict[str, Any]]) -> None:
        """Note checkpoint files written for ``global_step``; once every training rank's file is
        there, call :attr:`on_saved` (the runner writes the manifest)."""
        entry = self.saved.setdefault(global_step, {})
        for f in files:
            entry[f["name"]] = {"sha256": f["sha256"], "bytes": int(f["bytes"])}
        want = {f"g{g.gid}-r{r}.pt" for g in self.b.groups if g.trains for r in range(g.size)}
        if want <= set(entry) and self.on_saved is not None:
            self.on_saved(self)

    def _describe(self, nd: _Node) -> str:
        verts = self.b.graph.vertices
        what = f"node {nd.id} ({_KIND[nd.kind]} "
        if nd.kind != OP:
            what += f"{verts[nd.source].name} → "
        what += f"{verts[nd.vertex].name} step {nd.step}"
        return what + (f" phase {nd.phase})" if nd.phase else ")")

    def _waiting_on(self, running: dict[Any, int], nodes: list[_Node]) -> str:
        ids = sorted(set(running.values()))
        shown = ", ".join(self._describe(nodes[i]) for i in ids[:3])
        return f"waiting for {shown}" + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")

    def _check(self, nd: _Node, ref: Any, dead: bool = False) -> None:
        """Raise :class:`RunError` naming node, step, worker and device if ``ref`` holds an error
        (a worker that raised or died) or its worker is ``dead``; the other ranks of the group may
        be stuck in a collective, so the run stops here instead of waiting for them. A worker
        that raised because a peer's process is gone (a collective or send to it fails) is not
        the cause: the dead peer is named. :attr:`failure` keeps what failed, with ``lost = True``
        when the worker's process is gone (a device loss) rather than raised."""
        import ray

        owner = self.ref_owner[ref]
        err: BaseException | None = None
        if not dead:
            try:
                ray.get(ref)
                return
            except Exception as exc:
                err = exc
        lost = dead or isinstance(err, ray.exceptions.RayActorError)
        why = cause(err) if err is not None else "worker process lost"
        if not lost:
            peer = self._dead_peer(nd)
            if peer is not None:
                owner, lost, why = peer, True, "worker process lost"
        if lost and err is None:
            why = f"worker process lost ({self.watch.dead(owner) or 'Ray reports its actor dead'})"
        self._fail(nd, owner, lost=lost, skip=ref)
        raise RunError(
            f"{self._describe(nd)} failed on worker {owner.worker} (device {owner.device}): {why}",
            node=nd.id,
            step=nd.step,
            vertex=self.b.graph.vertices[nd.vertex].name,
            worker=owner.worker,
            device=owner.device,
            lost=lost,
        ) from err

    def _dead_peer(self, nd: _Node) -> Owner | None:
        """A worker of the run whose process is gone — of ``nd``'s group first."""
        mine = [o for (gid, _), o in self.owners.items() if gid == nd.group]
        others = [o for (gid, _), o in self.owners.items() if gid != nd.group]
        for o in mine + others:
            if (o.gid, o.rank) not in self.dead and self.watch.dead(o) is not None:
                return o
        return None

    def _fail(self, nd: _Node, owner: Owner | None, *, lost: bool, skip: Any = None) -> None:
        """Record the first failure (:attr:`failure`) and what is still in flight."""
        self.failure = {
            "lost": lost,
            "gid": owner.gid if owner else None,
            "rank": owner.rank if owner else None,
            "device": owner.device if owner else None,
            "step": nd.step,
            "vertex": self.b.graph.vertices[nd.vertex].name,
            "worker": owner.worker if owner else None,
            "node": nd.id,
        }
        if lost and owner is not None:
            self.dead.add((owner.gid, owner.rank))
        self.in_flight = [r for refs in self._wait_refs.values() for r in refs if r is not skip]

    def live_actors(self) -> list[tuple[int, int, Any]]:
        """``(gid, rank, actor)`` of every worker not known to be lost."""
        return [
            (g.gid, r, a)
            for g in self.b.groups
            for r, a in enumerate(self.actors[g.gid])
            if (g.gid, r) not in self.dead
        ]

    def final_weights(self) -> dict[str, dict[str, Any]]:
        """Full weights of every trained model, assembled by its training group's rank 0 from every
        rank's shards (:meth:`~rpeg.runtime.worker.transfers.WorkerTransfers.assembled`)."""
        out = {}
        for g in self.b.groups:
            if g.trains:
                grp = self.groups[g.gid]
                what = f"gathering {g.model}'s final weights"
                (out[g.model],) = self.get([grp.rank(0, "assembled", grp.publish())], what)
        return out

    def stop(self) -> None:
        """Kill the workers and release the placement groups (unless borrowed, see :meth:`start`).

        Inside a :class:`~rpeg.runtime.driver.pool.WorkerPool`, the workers of a controller whose DAG
        completed (:attr:`finished`) and that lost none go back to the pool instead, with the
        placement groups it owns; a failed run's workers are killed (a rank may still sit in a
        collective). Stopping again does nothing."""
        import ray
        from ray.util.placement_group import remove_placement_group

        if not self.procs and not self.placement:
            return
        pooled = self.pool is not None and self.finished and not self.dead and self.pool.connected()
        if pooled:
            self.pool.give_back(
                [(*self.bundles[dev], a) for dev, a in self.procs.items()],
                (self.placement, self.slots, self.shape) if self.owns_placement else None,
            )
        else:
            for a in self.procs.values():
                with contextlib.suppress(Exception):  # already dead
                    ray.kill(a)
            for pg in self.placement if self.owns_placement else []:
                with contextlib.suppress(Exception):
                    remove_placement_group(pg)
        self.groups.clear()
        self.procs.clear()
        self.placement, self.slots = [], []
