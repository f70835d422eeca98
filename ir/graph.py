"""The compact RPEG ``G° = (V°, E°_data, E°_pub, A, M, τ)`` and its well-formedness checks.

A vertex is one model invocation (role, model, declared inputs and outputs); a container is a
named payload with element count and element size; data edges are dependencies inside one RL
step; publication edges carry a trainable model's weights from its training vertex to the
consumers of those weights in later steps, with staleness budget ``τ(m)`` (SPEC §3).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from .models import ModelSpec
from .types import Head, Role

__all__ = ["RPEG", "Container", "DataEdge", "ModelInstance", "PubEdge", "Vertex"]


@dataclass(frozen=True)
class Container:
    """A named payload: ``count`` elements of ``elem_bytes`` bytes (``bytes = #a·s(a)``)."""

    name: str
    count: int
    elem_bytes: int
    weights_of: str | None = None  # model name when this is a weight container W_m

    def __post_init__(self) -> None:
        if self.count < 0 or self.elem_bytes < 1:
            raise ValueError(
                f"container {self.name!r}: count must be ≥ 0 and elem_bytes ≥ 1, "
                f"got count={self.count!r}, elem_bytes={self.elem_bytes!r}"
            )

    @property
    def nbytes(self) -> int:
        """``#a·s(a)``."""
        return self.count * self.elem_bytes


@dataclass(frozen=True)
class ModelInstance:
    """A model as the pipeline uses it: its spec, whether it trains, and the heads it carries.

    ``head`` is what its weights hold (``BOTH`` for a shared actor–critic backbone).
    """

    name: str
    spec: ModelSpec
    trainable: bool
    head: Head


@dataclass(frozen=True)
class Vertex:
    """One model invocation.

    Parameters
    ----------
    name
        Unique vertex name (e.g. ``actor_gen``).
    role
        Generation, inference or training.
    model
        Name of the :class:`ModelInstance` it runs.
    head
        The head this invocation computes (a value inference on a shared backbone is ``SCALAR``).
    sequences
        Sequences it processes per step (``B·R`` for most; ``B`` for a greedy baseline).
    inputs, outputs
        Declared container names ``I(v)`` and ``O(v)``.
    """

    name: str
    role: Role
    model: str
    head: Head
    sequences: int
    inputs: frozenset[str]
    outputs: frozenset[str]


@dataclass(frozen=True)
class DataEdge:
    """Dependency inside a step: ``src`` produces ``containers`` that ``dst`` reads."""

    src: str
    dst: str
    containers: tuple[str, ...]


@dataclass(frozen=True)
class PubEdge:
    """Weights of ``model`` flow from training vertex ``src`` to consumer ``dst`` in later steps."""

    src: str
    dst: str
    model: str


@dataclass
class RPEG:
    """A compact RL pipeline execution graph.

    Parameters
    ----------
    algorithm
        The algorithm it was built for.
    models
        Model instances by name.
    containers
        Containers by name.
    vertices
        Vertices; their order is the RPEG vertex order used for tie-breaking (SPEC §7) and must be
        a topological order of the data edges.
    data_edges, pub_edges
        ``E°_data`` and ``E°_pub``.
    staleness
        ``τ(m)`` per trainable model.
    ac_sharing
        Whether this graph uses the shared actor–critic backbone.
    inputs, outputs
        Declared boundary inputs (prompts, frozen and initial weights) and outputs.
    """

    algorithm: str
    models: dict[str, ModelInstance]
    containers: dict[str, Container]
    vertices: list[Vertex]
    data_edges: list[DataEdge]
    pub_edges: list[PubEdge]
    staleness: dict[str, int]
    ac_sharing: bool = False
    inputs: frozenset[str] = field(default_factory=frozenset)
    outputs: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        self.validate()

    @cached_property
    def index(self) -> dict[str, int]:
        """Vertex name → position in :attr:`vertices`."""
        return {v.name: i for i, v in enumerate(self.vertices)}

    def vertex(self, name: str) -> Vertex:
        """The vertex called ``name``."""
        return self.vertices[self.index[name]]

    def edge_bytes(self, edge: DataEdge) -> int:
        """Payload of a data edge: the sum of its containers' bytes."""
        return sum(self.containers[c].nbytes for c in edge.containers)

    # ------------------------------------------------------------------ well-formedness
    def validate(self) -> None:
        """Check SPEC §3's four well-formedness rules and basic consistency.

        (1) every edge's container ∈ O(src) ∩ I(dst); (2) publication edges start at a training
        vertex and carry that model's weights; (3) a container read but never produced is a
        declared input, one produced but never read is a declared output; (4) the data-edge
        graph is acyclic (checked as: the vertex order is topological).

        Raises
        ------
        ValueError
            Naming the offending vertex, edge or container.
        """
        names = [v.name for v in self.vertices]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"RPEG: duplicate vertex names {dup}")
        pos = {n: i for i, n in enumerate(names)}
        by_name = {v.name: v for v in self.vertices}
        for v in self.vertices:
            if v.model not in self.models:
                raise ValueError(f"RPEG: vertex {v.name!r} runs unknown model {v.model!r}")
            for c in v.inputs | v.outputs:
                if c not in self.containers:
                    raise ValueError(f"RPEG: vertex {v.name!r} declares unknown container {c!r}")
            if v.sequences < 1:
                raise ValueError(f"RPEG: vertex {v.name!r} has sequences={v.sequences}, must be ≥ 1")
        for e in self.data_edges:
            for end in (e.src, e.dst):
                if end not in by_name:
                    raise ValueError(f"RPEG: data edge {e.src}->{e.dst} names unknown vertex {end!r}")
            if not e.containers:
                raise ValueError(f"RPEG: data edge {e.src}->{e.dst} carries no container")
            for c in e.containers:  # rule (1)
                if c not in by_name[e.src].outputs or c not in by_name[e.dst].inputs:
                    raise ValueError(
                        f"RPEG: data edge {e.src}->{e.dst} carries {c!r}, which is not in "
                        f"O({e.src}) ∩ I({e.dst}) (rule 1)"
                    )
            if pos[e.src] >= pos[e.dst]:  # rule (4): the order given is topological iff acyclic
                raise ValueError(
                    f"RPEG: data edge {e.src}->{e.dst} goes backwards in the vertex order; the data "
                    "edges must form a DAG listed in topological order (rule 4)"
                )
        for e in self.pub_edges:
            for end in (e.src, e.dst):
                if end not in by_name:
                    raise ValueError(f"RPEG: publication edge {e.src}->{e.dst} names unknown vertex {end!r}")
            src = by_name[e.src]
            if src.role is not Role.TRAINING:  # rule (2)
                raise ValueError(
                    f"RPEG: publication edge {e.src}->{e.dst} must start at a training vertex, "
                    f"{e.src!r} is {src.role.value} (rule 2)"
                )
            if src.model != e.model or by_name[e.dst].model != e.model:
                raise ValueError(
                    f"RPEG: publication edge {e.src}->{e.dst} must carry the weights of the model both "
                    f"ends run; it names {e.model!r} (rule 2)"
                )
            w = self.weights_container(e.model)
            if w not in src.outputs or w not in by_name[e.dst].inputs:
                raise ValueError(
                    f"RPEG: publication edge {e.src}->{e.dst}: {w!r} must be in O(src) ∩ I(dst) (rule 1)"
                )
            if e.model not in self.staleness:
                raise ValueError(f"RPEG: trainable model {e.model!r} has no staleness budget")
        produced = {c for v in self.vertices for c in v.outputs}
        read = {c for v in self.vertices for c in v.inputs}
        for c in sorted(read - produced):  # rule (3)
            if c not in self.inputs:
                raise ValueError(
                    f"RPEG: container {c!r} is read but never produced nor declared an input (rule 3)"
                )
        for c in sorted(produced - read):
            if c not in self.outputs:
                raise ValueError(
                    f"RPEG: container {c!r} is produced but never read nor declared an output (rule 3)"
                )
        for v in self.vertices:  # every non-boundary input must arrive on an edge from its producer
            incoming = {c for e in self.data_edges if e.dst == v.name for c in e.containers}
            for c in v.inputs:
                if c in self.inputs or self.containers[c].weights_of is not None:
                    continue
                if c not in incoming:
                    raise ValueError(
                        f"RPEG: vertex {v.name!r} reads {c!r} but no data edge brings it (rule 1)"
                    )
        for m, tau in self.staleness.items():
            if m not in self.models or not self.models[m].trainable:
                raise ValueError(f"RPEG: staleness given for {m!r}, which is not a trainable model")
            if tau < 0:
                raise ValueError(f"RPEG: staleness of {m!r} must be ≥ 0, got {tau}")

    @staticmethod
    def weights_container(model: str) -> str:
        """Name of the weight container ``W_m`` of ``model``."""
        return f"W_{model}"

    def training_vertex(self, model: str) -> Vertex | None:
        """The training vertex of ``model`` (``None`` for a frozen model)."""
        for v in self.vertices:
            if v.role is Role.TRAINING and v.model == model:
                return v
        return None
