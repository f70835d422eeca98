"""The driver's handle on one worker group: every remote call to a worker goes through
:class:`WorkerGroup` (SPEC §11).

A call names a method of :data:`~rpeg.runtime.protocol.PROTOCOL` and is checked against its
declaration before it is sent: a :attr:`~rpeg.runtime.protocol.Dispatch.GROUP` method goes to
every live rank of the group with the same arguments (:meth:`WorkerGroup.all`), a
:attr:`~rpeg.runtime.protocol.Dispatch.RANK` method to the ranks the caller names, each with its
own arguments (:meth:`WorkerGroup.rank`). Each call comes back keyed by its worker,
``(gid, rank)``, so that every wait can name the worker and its device
(:mod:`~rpeg.runtime.driver.liveness`). The controller, recovery, transitions and checkpoint
restore hold groups, not actors.

A rank's actor is the process of its device
(:class:`~rpeg.runtime.worker.process.WorkerProcess`), which holds every worker placed on the
device: two groups that share devices share actors, and each call names its group (``gid``).
"""

from __future__ import annotations

from typing import Any

from ..binding import GroupSpec
from ..protocol import NodeCall, ProtocolError, check_call
from .liveness import Owner

__all__ = ["Call", "WorkerGroup", "call_worker"]

#: A submitted call: ``((gid, rank), object ref)``.
Call = tuple[tuple[int, int], Any]


class WorkerGroup:
    """The ranks of group ``spec`` (their Ray actors and owners, rank order).

    Parameters
    ----------
    spec
        The group.
    actors
        Rank ``r``'s device process (a :class:`~rpeg.runtime.worker.process.WorkerProcess` actor)
        at ``actors[r]``.
    owners
        Rank ``r``'s :class:`~rpeg.runtime.driver.liveness.Owner` at ``owners[r]``.
    dead
        The controller's set of ``(gid, rank)`` known lost (shared, not copied): a group-wide call
        goes to the live ranks.
    """

    def __init__(self, spec: GroupSpec, actors: list[Any], owners: list[Owner], dead: set[tuple[int, int]]):
        if len(actors) != spec.size or len(owners) != spec.size:
            raise ValueError(
                f"group g{spec.gid}: {len(actors)} actors and {len(owners)} owners for {spec.size} ranks"
            )
        self.spec, self.actors, self.owners, self._dead = spec, actors, owners, dead

    @property
    def gid(self) -> int:
        """The group's id."""
        return self.spec.gid

    def live(self) -> list[int]:
        """Ranks not known lost, in order."""
        return [r for r in range(self.spec.size) if (self.gid, r) not in self._dead]

    # ------------------------------------------------------------------ the protocol
    def all(self, method: str, *args: Any) -> list[Call]:
        """``method(*args)`` on every live rank (a :attr:`~rpeg.runtime.protocol.Dispatch.GROUP`
        or :attr:`~rpeg.runtime.protocol.Dispatch.RANK` method), in rank order; OP nodes go
        through :meth:`op` (three results per call)."""
        if check_call(method, whole_group=True).returns != 1:
            raise ProtocolError(
                f"worker method {method!r} returns several results: call WorkerGroup.{method}()"
            )
        return [((self.gid, r), self.actors[r].call.remote(self.gid, method, *args)) for r in self.live()]

    def rank(self, rank: int, method: str, *args: Any) -> Call:
        """``method(*args)`` on rank ``rank`` alone (a
        :attr:`~rpeg.runtime.protocol.Dispatch.RANK` method)."""
        check_call(method, whole_group=False)
        return (self.gid, rank), self.actors[rank].call.remote(self.gid, method, *args)

    def op(self, node: NodeCall, inputs: dict[str, list]) -> tuple[list[Any], list[Any], list[Any]]:
        """One OP node on every rank: per rank, refs of ``(meta, containers, publication)``."""
        check_call("op", whole_group=True)
        metas, datas, publs = [], [], []
        for a in self.actors:
            m, d, p = a.op.options(num_returns=3).remote(self.gid, node, inputs)
            metas.append(m)
            datas.append(d)
            publs.append(p)
        return metas, datas, publs

    def publish(self) -> list[Any]:
        """Refs of every live rank's publication of its current weights."""
        return [ref for _, ref in self.all("publish")]

    def install(self, pubs: list[Any], version: int) -> list[Call]:
        """Install the publications ``pubs`` as ``version`` on every live rank."""
        return self.all("install", pubs, version)


def call_worker(owner: Owner, method: str, *args: Any) -> Any:
    """``method(*args)`` on the one worker ``owner`` (a
    :attr:`~rpeg.runtime.protocol.Dispatch.RANK` method; a transition addresses workers of both
    plans by their place in its own group). The call runs at once with the transition's calls to
    the other workers of its process (:meth:`~rpeg.runtime.worker.process.WorkerProcess.call_concurrent`:
    two workers of a device exchange cells with each other), and after this worker's earlier
    ones: each carries its turn, ``owner.turns``. Returns the ref."""
    check_call(method, whole_group=False)
    turn, owner.turns = owner.turns, owner.turns + 1
    return owner.actor.call_concurrent.remote(owner.gid, turn, method, *args)
