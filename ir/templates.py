"""Algorithm templates (PPO, GRPO, ReMax, DPO) and structural candidates ``Ycand = {(ac, τ)}``.

Container sizes (SPEC §3): prompts ``X`` are ``B·Lp`` tokens, completions ``Y`` are
``B·R·(Lp+Lr)`` tokens, log-probs and values ``B·R·Lr`` scalars, rewards ``B·R`` scalars, weights
``W_m`` are ``N_m`` parameters of ``sb`` bytes. Tokens and scalars travel as 4-byte int32/float32
(see ``docs/decisions.md``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from .graph import RPEG, Container, DataEdge, ModelInstance, PubEdge, Vertex
from .types import Head, Role
from .workload import Workload

__all__ = ["Structure", "build_graph", "structures"]

TOKEN_BYTES = 4  # int32 token ids
SCALAR_BYTES = 4  # float32 log-probs, values, rewards


@dataclass(frozen=True)
class Structure:
    """A structural candidate ``y = (ac, τ)``.

    Parameters
    ----------
    algorithm
        The workload's algorithm.
    ac_sharing
        Whether actor and critic share one backbone.
    staleness
        ``τ(m)`` per trainable model of the resulting graph, as sorted ``(model, τ)`` pairs
        (``actor_critic`` when shared).
    """

    algorithm: str
    ac_sharing: bool
    staleness: tuple[tuple[str, int], ...]

    @property
    def tau(self) -> dict[str, int]:
        """``τ`` as a dict."""
        return dict(self.staleness)

    @property
    def label(self) -> str:
        """Short readable form, e.g. ``ppo ac=0 τ(actor)=1 τ(critic)=0``."""
        taus = " ".join(f"τ({m})={t}" for m, t in self.staleness)
        return f"{self.algorithm} ac={int(self.ac_sharing)} {taus}".strip()

    def to_dict(self) -> dict[str, object]:
        """The ``structure`` block of a result file."""
        return {"algorithm": self.algorithm, "ac_sharing": self.ac_sharing, "staleness": self.tau}

    @classmethod
    def synchronous(cls, workload: Workload) -> Structure:
        """No sharing, ``τ = 0`` everywhere (the baselines' structure)."""
        return cls(workload.algorithm, False, tuple((m, 0) for m in workload.trainable))


def structures(workload: Workload) -> list[Structure]:
    """Enumerate ``Ycand`` exhaustively (S1, S2): sharing choices × staleness products.

    With sharing the shared model ``actor_critic`` takes the staleness choices allowed for both
    the actor and the critic (their intersection; the actor's if empty).
    """
    out = []
    trainable = workload.trainable
    for combo in itertools.product(*(workload.staleness[m] for m in trainable)):
        out.append(Structure(workload.algorithm, False, tuple(zip(trainable, combo))))
    if workload.can_share_actor_critic:
        allowed = sorted(set(workload.staleness["actor"]) & set(workload.staleness["critic"]))
        for tau in allowed or workload.staleness["actor"]:
            out.append(Structure(workload.algorithm, True, (("actor_critic", tau),)))
    return out


def build_graph(workload: Workload, structure: Structure | None = None) -> RPEG:
    """Build the compact RPEG of ``workload`` under ``structure`` (default: synchronous).

    PPO: ``actor_gen → {ref_inf, reward_inf, critic_inf} → {actor_train, critic_train}`` with
    publications ``actor_train → actor_gen`` and ``critic_train → critic_inf``. GRPO drops the
    critic; ReMax adds a greedy-baseline generation ``actor_greedy_gen`` (``B`` sequences) whose
    completions the reward model also scores; DPO is offline: ``ref_inf``, ``actor_inf``,
    ``actor_train`` over ``B`` preference pairs. With actor–critic sharing one backbone
    ``actor_critic`` (policy and value heads) replaces both: one training vertex, and the value
    inference runs on the shared model.

    Raises
    ------
    ValueError
        If the structure does not fit the workload (wrong algorithm, sharing without a critic,
        staleness for a model the graph does not train).
    """
    structure = structure or Structure.synchronous(workload)
    if structure.algorithm != workload.algorithm:
        raise ValueError(
            f"structure.algorithm {structure.algorithm!r} does not match workload.algorithm "
            f"{workload.algorithm!r}"
        )
    if structure.ac_sharing and not ("actor" in workload.models and "critic" in workload.models):
        raise ValueError("structure.ac_sharing needs both an actor and a critic (S1)")
    g = _Builder()
    actor_name, critic_name = _add_models(g, workload, structure)
    wa = g.weights(actor_name)
    wref = g.weights("reference") if "reference" in g.models else None
    g.inputs |= {wa} | ({wref} if wref else set())
    algo = workload.algorithm
    if algo == "dpo":
        _add_dpo(g, workload, actor_name, wa, wref)
    else:
        _add_online(g, workload, structure, actor_name, critic_name, wa, wref)

    trained = {m for m, inst in g.models.items() if inst.trainable}
    tau = structure.tau
    if set(tau) != trained:
        raise ValueError(f"structure.staleness names {sorted(tau)}, but the graph trains {sorted(trained)}")
    return RPEG(
        algorithm=algo,
        models=g.models,
        containers=g.containers,
        vertices=g.vertices,
        data_edges=g.edges,
        pub_edges=g.pubs,
        staleness=dict(tau),
        ac_sharing=structure.ac_sharing,
        inputs=frozenset(g.inputs),
        outputs=frozenset(),
    )


def _add_models(g: _Builder, workload: Workload, structure: Structure) -> tuple[str, str | None]:
    """The model instances: the actor (``actor_critic`` with both heads when shared), the
    reference, the reward model and the critic where the workload has them; returns the names
    of the actor and of the critic (``None`` without one)."""
    actor_name = "actor_critic" if structure.ac_sharing else "actor"
    g.model(actor_name, workload.models["actor"], True, Head.BOTH if structure.ac_sharing else Head.LM)
    if "reference" in workload.models:
        g.model("reference", workload.models["reference"], False, Head.LM)
    if "reward" in workload.models:
        g.model("reward", workload.models["reward"], False, Head.SCALAR)
    critic_name = None
    if "critic" in workload.models:
        critic_name = actor_name if structure.ac_sharing else "critic"
        if not structure.ac_sharing:
            g.model("critic", workload.models["critic"], True, Head.SCALAR)
    return actor_name, critic_name


def _add_dpo(g: _Builder, workload: Workload, actor_name: str, wa: str, wref: str | None) -> None:
    """DPO, offline: ``ref_inf`` and ``actor_inf`` over the ``B·R`` preference pairs feed
    ``actor_train``, which publishes to ``actor_inf``."""
    assert wref is not None  # Workload keeps DPO's reference
    BR = workload.batch * workload.rollouts
    Lp, Lr = workload.prompt_len, workload.response_len
    pairs = g.container("pairs", BR * (Lp + Lr), TOKEN_BYTES)
    g.inputs.add(pairs)
    ref_lp = g.container("ref_logp", BR * Lr, SCALAR_BYTES)
    lp = g.container("logp", BR * Lr, SCALAR_BYTES)
    g.vertex("ref_inf", Role.INFERENCE, "reference", Head.LM, BR, {pairs, wref}, {ref_lp})
    g.vertex("actor_inf", Role.INFERENCE, actor_name, Head.LM, BR, {pairs, wa}, {lp})
    g.vertex("actor_train", Role.TRAINING, actor_name, Head.LM, BR, {pairs, ref_lp, lp, wa}, {wa})
    g.edge("ref_inf", "actor_train", ref_lp)
    g.edge("actor_inf", "actor_train", lp)
    g.pub("actor_train", "actor_inf", actor_name)


def _add_online(
    g: _Builder,
    workload: Workload,
    structure: Structure,
    actor_name: str,
    critic_name: str | None,
    wa: str,
    wref: str | None,
) -> None:
    """PPO, GRPO and ReMax: generation, the scoring inferences, training and the publications
    back to the generation (and to the critic's inference).

    Without a reference (``kl_coef = 0``) there is no ``ref_inf`` and no ``ref_logp``; with a
    rule reward (SPEC §14.8) there is no ``reward_inf``: the generation's outputs include the
    rewards, whose host time the cost model charges to the generation
    (``docs/decisions.md``)."""
    B, R, Lp, Lr = workload.batch, workload.rollouts, workload.prompt_len, workload.response_len
    BR = B * R
    prompts = g.container("prompts", B * Lp, TOKEN_BYTES)
    g.inputs.add(prompts)
    Y = g.container("completions", BR * (Lp + Lr), TOKEN_BYTES)
    lp = g.container("logp", BR * Lr, SCALAR_BYTES)
    ref_lp = g.container("ref_logp", BR * Lr, SCALAR_BYTES) if wref else None
    rw = g.container("rewards", BR, SCALAR_BYTES)
    rule = workload.reward == "rule"
    greedy = None
    if workload.algorithm == "remax":
        greedy = g.container("greedy_completions", B * (Lp + Lr), TOKEN_BYTES)
    # a rule reward is computed on the host from the completions: the generation yields it
    trainer_logp = workload.old_logprob == "trainer"
    gen_out = {Y} | (set() if trainer_logp else {lp}) | ({rw} if rule else set())
    g.vertex("actor_gen", Role.GENERATION, actor_name, Head.LM, BR, {prompts, wa}, gen_out)
    if greedy:
        g.vertex("actor_greedy_gen", Role.GENERATION, actor_name, Head.LM, B, {prompts, wa}, {greedy})
    if trainer_logp:  # the old policy's log-probs from a teacher-forced pass of the actor
        g.vertex("actor_logp", Role.INFERENCE, actor_name, Head.LM, BR, {Y, wa}, {lp})
    if wref:
        g.vertex("ref_inf", Role.INFERENCE, "reference", Head.LM, BR, {Y, wref}, {ref_lp})
    if not rule:
        wrw = g.weights("reward")
        g.inputs.add(wrw)
        reward_in = {Y, wrw} | ({greedy} if greedy else set())
        g.vertex(
            "reward_inf",
            Role.INFERENCE,
            "reward",
            Head.SCALAR,
            BR + (B if greedy else 0),
            reward_in,
            {rw},
        )
    train_in = {Y, lp, rw, wa} | ({ref_lp} if ref_lp else set())
    if greedy and rule:  # the baseline's rule reward is computed from the greedy completions
        train_in.add(greedy)
    values = None
    if critic_name is not None:
        values = g.container("values", BR * Lr, SCALAR_BYTES)
        wc = g.weights(critic_name) if critic_name != actor_name else wa
        g.inputs.add(wc)
        g.vertex("critic_inf", Role.INFERENCE, critic_name, Head.SCALAR, BR, {Y, wc}, {values})
        train_in.add(values)
    if ref_lp:
        g.edge("actor_gen", "ref_inf", Y)
    if not rule:
        g.edge("actor_gen", "reward_inf", Y)
    if greedy and not rule:
        g.edge("actor_greedy_gen", "reward_inf", greedy)
    if values is not None:
        g.edge("actor_gen", "critic_inf", Y)
    if structure.ac_sharing:
        g.vertex("actor_critic_train", Role.TRAINING, actor_name, Head.BOTH, BR, train_in, {wa})
        train = "actor_critic_train"
    else:
        g.vertex("actor_train", Role.TRAINING, actor_name, Head.LM, BR, train_in, {wa})
        train = "actor_train"
    if trainer_logp:
        g.edge("actor_gen", "actor_logp", Y)
        g.edge("actor_logp", train, lp)
        g.edge("actor_gen", train, Y, *((rw,) if rule else ()))
    else:
        g.edge("actor_gen", train, Y, lp, *((rw,) if rule else ()))
    if ref_lp:
        g.edge("ref_inf", train, ref_lp)
    if not rule:
        g.edge("reward_inf", train, rw)
    elif greedy:
        g.edge("actor_greedy_gen", train, greedy)
    if values is not None:
        g.edge("critic_inf", train, values)
    if critic_name is not None and not structure.ac_sharing:
        wc = RPEG.weights_container("critic")
        g.vertex("critic_train", Role.TRAINING, "critic", Head.SCALAR, BR, {Y, rw, values, wc}, {wc})
        g.edge("actor_gen", "critic_train", Y, *((rw,) if rule else ()))
        if not rule:
            g.edge("reward_inf", "critic_train", rw)
        g.edge("critic_inf", "critic_train", values)
        g.pub("critic_train", "critic_inf", "critic")
    g.pub(train, "actor_gen", actor_name)
    if trainer_logp:  # the pass scores with the weights the rollout sampled with
        g.pub(train, "actor_logp", actor_name)
    if greedy:
        g.pub(train, "actor_greedy_gen", actor_name)
    if structure.ac_sharing:
        g.pub(train, "critic_inf", actor_name)


class _Builder:
    """Collects the pieces of a graph; :class:`RPEG` validates them once at the end."""

    def __init__(self) -> None:
        self.models: dict[str, ModelInstance] = {}
        self.containers: dict[str, Container] = {}
        self.vertices: list[Vertex] = []
        self.edges: list[DataEdge] = []
        self.pubs: list[PubEdge] = []
        self.inputs: set[str] = set()

    def weights(self, model: str) -> str:
        """The weight container ``W_m`` of ``model`` (``N_m`` parameters of ``sb`` bytes)."""
        spec = self.models[model].spec
        return self.container(RPEG.weights_container(model), spec.params, spec.dtype_bytes, weights_of=model)

    def model(self, name: str, spec, trainable: bool, head: Head) -> None:
        self.models[name] = ModelInstance(name, spec, trainable, head)

    def container(self, name: str, count: int, elem: int, weights_of: str | None = None) -> str:
        self.containers[name] = Container(name, count, elem, weights_of)
        return name

    def vertex(self, name: str, role: Role, model: str, head: Head, seqs: int, ins: set, outs: set) -> None:
        self.vertices.append(Vertex(name, role, model, head, seqs, frozenset(ins), frozenset(outs)))

    def edge(self, src: str, dst: str, *containers: str) -> None:
        self.edges.append(DataEdge(src, dst, tuple(containers)))

    def pub(self, src: str, dst: str, model: str) -> None:
        self.pubs.append(PubEdge(src, dst, model))
