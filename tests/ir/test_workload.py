import pytest

from rpeg import Workload, example_names, example_path, load_workload, model_preset
from rpeg.ir.workload import default_quantiles, with_response_len

M7 = model_preset("7b")


def ppo(**kw):
    args = {
        "algorithm": "ppo",
        "models": {"actor": M7, "critic": M7, "reward": M7},
        "batch": 64,
        "rollouts": 1,
        "prompt_len": 128,
        "response_len": 256,
    }
    args.update(kw)
    return Workload(**args)


def test_defaults_follow_spec():
    w = ppo()
    assert w.quantiles == ((0.5, 64), (0.85, 128), (1.0, 256))
    assert w.staleness == {"actor": (0, 1), "critic": (0, 1)}
    assert w.models["reference"] is M7
    assert w.tokens_per_step == 64 * (128 + 256)


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"algorithm": "sft"}, "algorithm"),
        ({"batch": 0}, "batch"),
        ({"response_len": -3}, "response_len"),
        ({"models": {"actor": M7, "reward": M7}}, "critic"),
        ({"quantiles": ((0.5, 10), (0.9, 300))}, "quantiles"),
        ({"quantiles": ((0.6, 10), (0.5, 20), (1.0, 256))}, "quantiles"),
        ({"staleness": {"reward": (0, 1)}}, "staleness"),
        ({"staleness": {"actor": (-1,)}}, "staleness"),
    ],
)
def test_bad_fields_are_named(kw, field):
    with pytest.raises(ValueError, match=field):
        ppo(**kw)


def test_dpo_needs_pairs():
    with pytest.raises(ValueError, match="rollouts"):
        Workload("dpo", {"actor": M7}, 64, 1, 128, 128)


def test_every_bundled_example_loads_with_cluster_defaults():
    assert len(example_names()) >= 4
    for name in example_names():
        wf = load_workload(example_path(name))
        assert wf.cluster_shape and wf.hardware and wf.description
        assert wf.workload.name == name


def test_toml_missing_field_is_named(tmp_path):
    p = tmp_path / "w.toml"
    p.write_text(
        'algorithm = "grpo"\n[batch]\nrollouts = 4\nprompt_len = 8\nresponse_len = 8\n'
        '[models]\nactor = "7b"\nreward = "7b"\n'
    )
    with pytest.raises(ValueError, match=r"batch\.prompts"):
        load_workload(p)
    p.write_text(
        'algorithm = "grpo"\n[batch]\nprompts = 4\nprompt_len = 8\nresponse_len = 8\n'
        '[models]\nactor = "gpt-5"\nreward = "7b"\n'
    )
    with pytest.raises(ValueError, match=r"models\.actor.*unknown model preset"):
        load_workload(p)


def _workload(**kw) -> Workload:
    """A 7B PPO workload for the ``with_response_len`` tests."""
    m = model_preset("llama2-7b")
    return Workload("ppo", {"actor": m, "critic": m, "reward": m}, 128, 1, 256, 1024, name="ppo-7b", **kw)


def test_quantiles_scale_with_the_response_length():
    w = _workload()
    w2 = with_response_len(w, 2048)
    assert w2.response_len == 2048 and w2.quantiles[-1] == (1.0, 2048)
    assert [f for f, _ in w2.quantiles] == [f for f, _ in w.quantiles]
    assert [t for _, t in w2.quantiles] == [2 * t for _, t in w.quantiles]
    assert w2.prompt_len == w.prompt_len and w2.name == w.name
    assert with_response_len(w, 1024) is w
    with pytest.raises(ValueError, match="response_len"):
        with_response_len(w, 0)
    with pytest.raises(ValueError, match="response_len"):
        with_response_len(w, 10.5)


def test_defaults_when_scaling_breaks_monotonicity():
    w = _workload(quantiles=((0.5, 1000), (0.9, 1010), (1.0, 1024)))
    # scaled to 8 tokens the first two lengths collide: the SPEC §2 defaults apply
    assert with_response_len(w, 8).quantiles == default_quantiles(8)
