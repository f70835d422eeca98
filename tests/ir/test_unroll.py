import pytest

from rpeg import model_preset
from rpeg.ir import EdgeKind, Structure, Workload, build_graph, unroll

M7 = model_preset("7b")


def grpo_graph(tau):
    w = Workload("grpo", {"actor": M7, "reward": M7}, 32, 4, 64, 128, staleness={"actor": (0, 1, 2)})
    return build_graph(w, Structure("grpo", False, (("actor", tau),)))


@pytest.mark.parametrize(
    ("tau", "expected"),
    [
        # k > τ: training at step k − τ − 1 feeds generation at step k
        (
            0,
            {
                ("actor_train", 0, "actor_gen", 1),
                ("actor_train", 1, "actor_gen", 2),
                ("actor_train", 2, "actor_gen", 3),
            },
        ),
        (1, {("actor_train", 0, "actor_gen", 2), ("actor_train", 1, "actor_gen", 3)}),
        (2, {("actor_train", 0, "actor_gen", 3)}),
    ],
)
def test_publication_edges_per_staleness(tau, expected):
    u = unroll(grpo_graph(tau), 4)
    assert u.edge_set(EdgeKind.PUB) == expected
    assert u.edge_set(EdgeKind.CHAIN) == {("actor_train", k - 1, "actor_train", k) for k in (1, 2, 3)}


def test_data_edges_are_copied_per_step():
    g = grpo_graph(0)
    u = unroll(g, 3)
    data = u.edge_set(EdgeKind.DATA)
    assert len(data) == 3 * len(g.data_edges)
    assert all(ks == kd for _, ks, _, kd in data)


def test_unrolled_graph_is_acyclic_and_forward():
    g = grpo_graph(1)
    u = unroll(g, 8)
    for e in u.edges:
        assert (e.src_step, e.src) < (e.dst_step, e.dst)


def test_bad_k_eval():
    with pytest.raises(ValueError, match="k_eval"):
        unroll(grpo_graph(0), 0)
