"""A worker's transfers: publishing and installing weight versions, fetching data containers,
and its part of a transition's state moves (SPEC §10–§11).

* weights: :meth:`~WorkerTransfers.publish` hands this rank's share of the current (or a kept,
  :meth:`~WorkerTransfers.publish_version`) version to the object store;
  :meth:`~WorkerTransfers.install` (a weight COMM/RESHARD node) assembles the full tensors of
  this rank's stage from the producer's shares and keeps its TP shard;
  :meth:`~WorkerTransfers.install_snapshot` keeps them as a snapshot of an older version;
* data: :meth:`~WorkerTransfers.fetch` (a data COMM node) copies containers into this rank's
  inbox, which the next OP node reads in sample-id order;
* transitions: ``xfer_*`` join the transition's process group, export this rank's state as EMU
  cells, run Split/Merge/Extend pieces point-to-point, drop cells and adopt the final ones
  (:mod:`~rpeg.runtime.driver.transition`).

:class:`WorkerTransfers` is a part of :class:`~rpeg.runtime.worker.core.Worker`, which owns the state
it uses.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ..binding import GroupSpec
from ..protocol import NodeCall
from .memory import release_freed_memory
from .model import StageModel
from .parallel import FSDPAdam, PackedShare, assemble, local, publication, shard_of, shareable
from .rollouts import Rollouts

__all__ = ["WorkerTransfers"]


class WorkerTransfers:
    """Weight versions, data containers and transition cells of one rank.

    Uses the :class:`~rpeg.runtime.worker.core.Worker`'s state below and the checkpoints'
    ``_snapshot``; :meth:`xfer_join` adds the transition's process group and cells.
    """

    group: GroupSpec
    rank: int
    mesh: Any
    model: StageModel
    optimizer: FSDPAdam | None
    version: int
    snapshots: dict[int, dict[str, torch.Tensor]]
    published: dict[int, PackedShare]
    siblings: dict[int, Any]
    device: torch.device | None
    inbox: dict[tuple, list[dict[str, torch.Tensor]]]
    rollouts: Rollouts
    _weights: Callable[[], dict[str, torch.Tensor]]
    _write_weights: Callable[..., None]
    full_weights: Callable[[], contextlib.AbstractContextManager[None]]

    # ------------------------------------------------------------------ weights
    def publish(
        self, keep: bool = False
    ) -> tuple[tuple[int, int], dict[str, tuple[torch.Tensor, int | None]]] | None:
        """This rank's share of the current weights (DP replica 0 only; replicated tensors from
        TP rank 0 only) as ``((p, t), publication)``, or ``None``. Every rank of the group calls
        it: with ZeRO stage 3 they all take part in gathering the weights.

        With ``keep`` the share stays in this process as :attr:`published` of the current
        version, for the groups on the same devices to read in place
        (:meth:`install_in_place`), and ``None`` is returned: nothing enters the object store. A
        group without pipeline and tensor parallelism keeps it on every DP rank (each holds the
        whole model, gathered here at ZeRO stage 3), so that each device's readers find all of
        it in their own process.
        """
        whole = self.group.pp * self.group.tp == 1  # every DP rank holds the whole model
        with self.full_weights():
            if keep:
                if self.mesh.d == 0 or whole:
                    self.published[self.version] = PackedShare.of(
                        self.model, include_replicated=self.mesh.t == 0
                    )
                return None
            if not self._publishes():
                return None
            return self._share_coords(), shareable(
                publication(self.model, include_replicated=self.mesh.t == 0 and self.mesh.d == 0)
            )

    def _publishes(self) -> bool:
        """Whether this rank's weights are part of a publication: replica 0's ranks, and with
        expert parallelism the first EP group's (replicas ``0 … Pe − 1``: each holds other experts;
        replicas above 0 add their expert blocks alone)."""
        return self.mesh.d < self.mesh.ep

    def _share_coords(self) -> tuple[int, int]:
        """``(p, key)`` of this rank's publication; :func:`~rpeg.runtime.worker.parallel.assemble`
        concatenates a sharded tensor's pieces in ``key`` order: ``e·Pt + t`` (EP rank ``e``)."""
        return self.mesh.p, self.mesh.e * self.group.tp + self.mesh.t

    def drop_published(self, version: int) -> None:
        """Release the kept publication of ``version`` (its last in-place reader has installed
        it)."""
        self.published.pop(version, None)

    def publish_version(
        self, version: int
    ) -> tuple[tuple[int, int], dict[str, tuple[torch.Tensor, int | None]]] | None:
        """Like :meth:`publish` for ``version``: the current weights or a kept snapshot (a
        transition hands the versions an asynchronous target still reads to its workers)."""
        if not self._publishes():
            return None
        if version == self.version:
            return self.publish()
        snap = self.snapshots.get(version)
        if snap is None:
            raise RuntimeError(
                f"worker {self.group.worker(self.rank)} holds version {self.version} and snapshots "
                f"{sorted(self.snapshots)} of {self.group.model}, not version {version}"
            )
        return self._share_coords(), shareable(
            publication(self.model, include_replicated=self.mesh.t == 0 and self.mesh.d == 0, weights=snap)
        )

    @torch.no_grad()
    def install_snapshot(self, pubs: list, version: int) -> dict[str, Any]:
        """Keep published weights of ``version`` as a snapshot in this rank's layout (a serving
        vertex on this training group reads it, see :meth:`op`)."""
        shards, _ = self._stage_shards(self._received(pubs)[0], f"published weights of version {version}")
        self.snapshots[version] = {k: t.clone() for k, t in shards.items()}
        return {"version": version}

    def assembled(self, pubs: list) -> dict[str, torch.Tensor]:
        """The whole model's full tensors from the publications ``pubs`` (object refs of every
        rank's :meth:`publish`), owned and writable — what the driver's
        :meth:`~rpeg.runtime.driver.controller.Controller.final_weights` returns."""
        return {k: v.clone() for k, v in self._received(pubs)[0].items()}

    def _received(self, pubs: list) -> tuple[dict[str, torch.Tensor], int]:
        """The full tensors of the publications ``pubs`` (object refs of :meth:`publish` results;
        views of the object store where a piece arrived whole) and the bytes received."""
        import ray

        got = [x for x in ray.get(list(pubs)) if x is not None]
        nbytes = sum(t.nbytes for _, pub in got for t, _ in pub.values())
        return assemble([(coords[1], pub) for coords, pub in got]), nbytes

    def _stage_shards(
        self, full: dict[str, torch.Tensor], source: str
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """This rank's TP shard of every tensor of its stage from the full tensors ``full`` (of
        ``source``, named in the error when one is missing), and the stage's full tensors. Inside
        :meth:`full_weights` for ZeRO-3 (the full weights' names and TP layout)."""
        state = self._weights()
        missing = [name for name in state if name not in full]
        if missing:
            raise RuntimeError(f"worker {self.group.worker(self.rank)}: {source} lack {missing[:3]}")
        shards = {name: shard_of(full[name], p, self.group.tp, self.mesh.t) for name, p in state.items()}
        return shards, {name: full[name] for name in state}

    @torch.no_grad()
    def install(self, pubs: list, version: int) -> dict[str, Any]:
        """Install published weights of ``version`` into this rank's layout (a COMM/RESHARD node).

        ``pubs`` are object refs of :meth:`publish` results of the producing group; each rank
        fetches them, assembles the full tensors of its stage and keeps its TP shard (with ZeRO
        stage 3, its DP shard of that: every rank of the group installs). Returns the bytes
        received and the time spent.
        """
        t0 = time.perf_counter()
        with self.full_weights():
            full, nbytes = self._received(pubs)
            shards, stage = self._stage_shards(full, f"published weights of version {version}")
            self._write_weights(shards)
        del full, shards
        return self._installed(version, stage, {"bytes": nbytes, "version": version}, t0)

    @torch.no_grad()
    def install_in_place(self, producer: int, version: int) -> dict[str, Any]:
        """Install ``version`` from the training group ``producer`` on the same devices, in place:
        a weight COMM/RESHARD node between colocated roles (SPEC §14.4), without the object store.

        This process's rank of ``producer`` kept its share of the version (:meth:`publish` with
        ``keep``); the shares of the producer's other ranks arrive over the producer's process
        group (:meth:`shares_in_place`, called here on the producer's worker: every process of
        the producer's group runs this call, since the two groups span the same devices). The own
        share is read without a copy; the rest is as :meth:`install`. Returns the bytes of the
        whole publication, those read in place (``in_place_bytes``) and the time spent.
        """
        t0 = time.perf_counter()
        src = self.siblings.get(producer)
        if src is None:
            raise RuntimeError(
                f"worker {self.group.worker(self.rank)}: its process holds no worker of group "
                f"g{producer}, so {self.group.model} version {version} cannot be installed in place"
            )
        with self.full_weights():
            full, nbytes, mine = src.shares_in_place(version, set(self._weights()))
            shards, stage = self._stage_shards(full, f"group g{producer}'s weights of version {version}")
            self._write_weights(shards)
        del full, shards
        out = {"bytes": nbytes, "in_place_bytes": mine, "version": version}
        return self._installed(version, stage, out, t0)

    def _installed(
        self, version: int, full: dict[str, torch.Tensor], out: dict[str, Any], t0: float
    ) -> dict[str, Any]:
        """The end of an install: hold ``version``, hand the full tensors to a rollout engine
        that takes weights, and return ``out`` with the engine's report and ``worker_time``."""
        push = full if self.rollouts.takes_weights else None  # only an engine needs them
        del full
        release_freed_memory()
        self.version = version
        if self.optimizer is None:  # a training group prunes its own snapshots (see _train)
            self.snapshots.clear()
        # a generating group's vLLM engine takes the new weights: the full tensors just received
        # (views of the object store or of the producer's kept share, or a TP trainer's
        # concatenated shards), which are exactly what the parameters now hold — no gather over
        # the replica's TP ranks
        sync = self.rollouts.sync(version, push) if push is not None else None
        del push
        if sync is not None:
            out["engine"] = sync
        out["worker_time"] = time.perf_counter() - t0
        return out

    def shares_in_place(self, version: int, wanted: set[str]) -> tuple[dict[str, torch.Tensor], int, int]:
        """The full tensors named in ``wanted`` of the kept publication of ``version``, assembled
        from every share of this group. A group without pipeline and tensor parallelism kept the
        whole model on every rank: its own share is the answer, and nothing crosses a process.
        Otherwise the ranks exchange the shares' headers (one ``all_gather_object``), then each
        DP-replica-0 rank ``q`` broadcasts its packed share
        (:class:`~rpeg.runtime.worker.parallel.PackedShare`, one buffer per dtype) over the group
        and the others receive it; every rank of this group must call it at once.

        Returns the tensors (views of this rank's own share where it holds one whole), the bytes
        of every share, and the bytes of this rank's own share (read in place).
        """
        sources = range(self.group.pp * self.group.tp)  # rank d·Pp·Pt + p·Pt + t with d = 0
        keeps = self.mesh.d == 0 or len(sources) == 1  # see publish(keep=True)
        own = self.published.get(version) if keeps else None
        if keeps and own is None:
            raise RuntimeError(
                f"worker {self.group.worker(self.rank)} keeps publications of versions "
                f"{sorted(self.published)} of {self.group.model}, not version {version}"
            )
        if len(sources) == 1:  # every rank holds the whole model: nothing crosses a process
            assert own is not None
            return assemble([(0, own.pieces(wanted))]), own.nbytes, own.nbytes
        headers: list[Any] = [None] * self.group.size
        dist.all_gather_object(headers, own.header if own is not None else None, group=self.mesh.group)
        shares = {
            q: own if q == self.rank else PackedShare.receiving(headers[q], self.device) for q in sources
        }
        for q in sources:
            for buf in shares[q].buffers():
                dist.broadcast(buf, group=self.mesh.group, group_src=q)
        pieces = [(q % self.group.tp, shares[q].pieces(wanted)) for q in sources]
        nbytes = sum(shares[q].nbytes for q in sources)
        return assemble(pieces), nbytes, own.nbytes if own is not None else 0

    # ------------------------------------------------------------------ data movement
    def fetch(self, key: tuple, refs: list) -> dict[str, Any]:
        """A data COMM node: copy containers from the object store into this rank's memory."""
        import ray

        t0 = time.perf_counter()
        parts = [x for x in ray.get(list(refs)) if x is not None]
        self.inbox[key] = parts
        nbytes = sum(t.numel() * t.element_size() for part in parts for t in part.values())
        return {"bytes": nbytes, "worker_time": time.perf_counter() - t0}

    def _inputs(self, node: NodeCall, inputs: dict[str, list]) -> dict[str, torch.Tensor]:
        """Merge the containers of all data inputs into one batch ordered by sample id; a source
        named in ``node.prefix`` keeps its own order and its keys get that prefix."""
        import ray

        merged: dict[str, torch.Tensor] = {}
        for src, refs in inputs.items():
            key = (node.vertex, node.step, src, node.phase)
            parts = self.inbox.pop(key, None)
            if parts is None:
                parts = [x for x in ray.get(list(refs)) if x is not None]
            if not parts:
                continue
            cat = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
            order = torch.argsort(cat["ids"])
            cat = {k: v[order] for k, v in cat.items()}
            prefix = node.prefix.get(src)
            if prefix:  # a second set of sequences (ReMax's greedy rollouts), kept apart by name
                merged.update({prefix + k: v for k, v in cat.items()})
                continue
            if "ids" in merged and not torch.equal(merged["ids"], cat["ids"]):
                raise RuntimeError(f"inputs of {node.vertex} step {node.step} cover different sequences")
            merged.update(cat)
        return merged

    # ------------------------------------------------------------------ transitions (SPEC §10)
    def xfer_host(self, world: int, timeout_s: float = 1800.0) -> str:
        """Open the transition group's store for ``world`` ranks on a port the OS picks (port 0:
        no pick-then-bind race); returns its ``host:port``. Called on the rank-0 worker first."""
        import datetime

        import ray

        host = ray.util.get_node_ip_address()
        timeout = datetime.timedelta(seconds=timeout_s)
        self.xstore = dist.TCPStore(host, 0, world, True, timeout, wait_for_workers=False)
        return f"{host}:{self.xstore.port}"

    def xfer_join(self, master: str, rank: int, world: int, timeout_s: float = 1800.0) -> None:
        """Join the transition's process group: every worker of the current and the target plan,
        a standalone gloo group beside this worker's own (``rank`` 0 hosts the store, opened by
        :meth:`xfer_host`)."""
        import datetime

        timeout = datetime.timedelta(seconds=timeout_s)
        if rank == 0:
            store = self.xstore
        else:
            host, port = master.rsplit(":", 1)
            store = dist.TCPStore(host, int(port), world, False, timeout)
        self.xpg = dist.ProcessGroupGloo(dist.PrefixStore("xfer", store), rank, world, timeout)
        self.xrank = rank
        self.units: dict[tuple, Any] = {}

    @torch.no_grad()
    def xfer_export(self, cells: list[tuple[Any, str, int, bool]]) -> dict[str, Any]:
        """Hand this rank's state to the transition as EMU cells ``(unit key, vertex, rank,
        with optimizer)``.

        Parameters come from the model; for a training vertex the ZeRO slices of the Adam moments
        are first all-gathered over the DP group (every rank of a replica then holds its cell's
        full moments, SPEC §10's unsharded EMU optimizer state). Must be called on every rank of
        the group at once (the gather is a collective).
        """
        from .state import CellState

        t0 = time.perf_counter()
        moments = None
        if self.optimizer is not None:
            moments = self._full_moments()
        params = self._snapshot()
        for key, vertex, i, trains in cells:
            mine = self.mesh.p * self.group.tp + self.mesh.t
            if i != mine or vertex not in self.group.vertices:
                raise RuntimeError(
                    f"worker {self.group.worker(self.rank)} holds cell {mine} of {self.group.vertices}, "
                    f"asked for cell {i} of {vertex!r}"
                )
            if trains and moments is None:
                raise RuntimeError(
                    f"worker {self.group.worker(self.rank)} trains nothing but {vertex!r} does"
                )
            cell = CellState(dict(params), step=self.optimizer.t if trains and self.optimizer else 0)
            if trains:
                assert moments is not None
                cell.m, cell.v = moments
            self.units[(key, i)] = cell
        return {"worker_time": time.perf_counter() - t0, "bytes": sum(c.nbytes for c in self.units.values())}

    def _full_moments(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Adam moments of this rank's whole local parameters, by name (AllGather of the ZeRO
        slices over the DP group)."""
        assert self.optimizer is not None
        flats = self.optimizer.full_moments()
        out: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] = ({}, {})
        off = 0
        for name, p in self.model.named_parameters():
            lp = local(p)
            k = lp.numel()
            for d, flat in zip(out, flats):
                d[name] = flat[off : off + k].view_as(lp).clone()
            off += k
        return out

    @torch.no_grad()
    def xfer_run(self, entries: list[dict[str, Any]]) -> dict[str, Any]:
        """Execute this worker's part of one primitive: assemble target cells from source cells.

        Each entry names a target cell (``dst`` key, its holder, its parameter names) and per
        source rank the holder, the source cell and the pieces (:class:`~rpeg.runtime.worker.state.Piece`)
        with their shapes. This worker sends the pieces it holds to other holders, receives the
        pieces its own target cells need (gloo point-to-point, all posted before any wait) and
        assembles its cells. Returns bytes sent/received and the time spent.
        """
        from .state import CellState, assemble_cell

        t0 = time.perf_counter()
        works, recvs, sent, got = [], [], 0, 0
        staged: dict[int, dict[int, CellState]] = {}
        for n, e in enumerate(entries):
            mine_dst = e["holder"] == self.xrank
            for r, src in e["sources"].items():
                if src["holder"] == self.xrank:
                    cell = self.units[tuple(src["key"])]
                    if e["moments"] and cell.m is None:
                        raise RuntimeError(f"cell {src['key']} holds no optimizer state for {e['key']}")
                    parts = cell.tensors(src["pieces"])
                    if not e["moments"]:  # the target keeps parameters only
                        parts = parts[: len(src["pieces"])]
                    if mine_dst:
                        staged.setdefault(n, {})[r] = _sliced(cell, src["pieces"], parts, e["moments"])
                    else:
                        flat = torch.cat([t.reshape(-1) for t in parts] + [torch.tensor([float(cell.step)])])
                        works.append(self.xpg.send([flat], e["holder"], src["tag"]))
                        sent += flat.numel() * flat.element_size()
                elif mine_dst:
                    numel = sum(math.prod(s) for s in src["shapes"]) * (3 if e["moments"] else 1) + 1
                    buf = torch.empty(numel)
                    works.append(self.xpg.recv([buf], src["holder"], src["tag"]))
                    recvs.append((n, r, src, buf))
                    got += buf.numel() * buf.element_size()
        for w in works:
            w.wait()
        for n, r, src, buf in recvs:
            staged.setdefault(n, {})[r] = _unpack(buf, src["pieces"], src["shapes"], entries[n]["moments"])
        for n, e in enumerate(entries):
            if e["holder"] == self.xrank:
                cell = assemble_cell(
                    e["names"], staged.get(n, {}), {r: s["pieces"] for r, s in e["sources"].items()}
                )
                if not e["moments"]:
                    cell.m = cell.v = None
                self.units[tuple(e["key"])] = cell
        return {"sent": sent, "received": got, "worker_time": time.perf_counter() - t0}

    def xfer_drop(self, keys: list[tuple]) -> int:
        """Destroy: forget cells; returns the bytes freed."""
        freed = 0
        for k in keys:
            cell = self.units.pop(tuple(k), None)
            freed += cell.nbytes if cell is not None else 0
        return freed

    @torch.no_grad()
    def xfer_adopt(self, keys: dict[str, Any]) -> dict[str, Any]:
        """Load this worker's model (and optimizer slice) from the cells the transition built for
        it: ``keys["cells"]`` maps each vertex it serves to a unit key, ``keys["train"]`` names the
        training vertex (or is ``None``). Every vertex must bring identical parameters (copies of
        one version). Leaves the transition group."""
        i = self.mesh.p * self.group.tp + self.mesh.t
        cells = {v: self.units.pop((tuple(k), i)) for v, k in keys["cells"].items()}
        train = keys["train"]
        main = cells[train] if train in cells else next(iter(cells.values()))
        for v, c in cells.items():
            for name, t in c.params.items():
                if not torch.equal(t, main.params[name]):
                    raise RuntimeError(
                        f"worker {self.group.worker(self.rank)}: vertex {v!r} brings parameter {name!r} "
                        f"different from {train or 'the group'}'s copy (versions out of sync)"
                    )
        state = self._weights()
        if set(state) != set(main.params):
            raise RuntimeError(
                f"worker {self.group.worker(self.rank)}: transition cell holds {sorted(main.params)[:3]}…, "
                f"the model needs {sorted(state)[:3]}…"
            )
        for name, p in state.items():
            src = main.params[name]
            if tuple(src.shape) != tuple(local(p).shape):
                raise RuntimeError(
                    f"worker {self.group.worker(self.rank)}: {name!r} arrives as {tuple(src.shape)}, "
                    f"the layout needs {tuple(local(p).shape)}"
                )
        self._write_weights(main.params)
        self.rollouts.weights_replaced()
        if self.optimizer is not None:
            if main.m is None or main.v is None:
                raise RuntimeError(f"worker {self.group.worker(self.rank)}: no optimizer state arrived")
            names = [n for n, _ in self.model.named_parameters()]
            self.optimizer.load_full_moments(
                torch.cat([main.m[n].reshape(-1) for n in names]),
                torch.cat([main.v[n].reshape(-1) for n in names]),
                main.step,
            )
        self.units.clear()
        self.xpg = self.xstore = None
        return {"step": main.step}


def _sliced(cell: Any, pieces: list, parts: list[torch.Tensor], moments: bool) -> Any:
    """The pieces of a local cell as a cell of their own (views, no copy)."""
    from .state import CellState

    k = len(pieces)
    out = CellState({pc.name: parts[j] for j, pc in enumerate(pieces)}, step=cell.step)
    if moments:
        out.m = {pc.name: parts[k + j] for j, pc in enumerate(pieces)}
        out.v = {pc.name: parts[2 * k + j] for j, pc in enumerate(pieces)}
    return out


def _unpack(buf: torch.Tensor, pieces: list, shapes: list, moments: bool) -> Any:
    """Inverse of the sender's packing: parameters, then ``m``, then ``v``, then the counter."""
    from .state import CellState

    groups, off = [], 0
    for _ in range(3 if moments else 1):
        d = {}
        for pc, shape in zip(pieces, shapes):
            n = math.prod(shape)
            d[pc.name] = buf[off : off + n].view(shape)
            off += n
        groups.append(d)
    cell = CellState(groups[0], step=int(buf[off].item()))
    if moments:
        cell.m, cell.v = groups[1], groups[2]
    return cell
