import pytest

from rpeg import Workload, example_names, example_path, load_workload, model_preset
from rpeg.ir import Role, build_graph
from rpeg.ir.workload import LengthBucket, default_quantiles, with_response_len

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
    # SPEC §14: a model reward, β = 0.01 (so a reference), log-probs from the rollout, one update
    assert (w.reward, w.reward_cost_s, w.kl_coef, w.old_logprob, w.mini_batches) == (
        "model",
        0.0,
        0.01,
        "rollout",
        1,
    )
    assert w.roles == ("actor", "critic", "reward", "reference")
    # real tokens B·R·(Lp + Ē): Ē = 0.5·(0 + 64)/2 + 0.35·(64 + 128)/2 + 0.15·(128 + 256)/2 = 78.4
    assert w.mean_response == pytest.approx(78.4)
    assert w.tokens_per_step == pytest.approx(64 * (128 + 78.4))
    assert w.padded_tokens_per_step == 64 * (128 + 256)


def test_buckets_and_mean_response_by_hand():
    w = ppo()
    # default quantiles (0.5, 64), (0.85, 128), (1.0, 256): shares 0.5, 0.35, 0.15
    assert [b.share for b in w.buckets] == pytest.approx([0.5, 0.35, 0.15])
    assert [(b.lo, b.hi) for b in w.buckets] == [(0, 64), (64, 128), (128, 256)]
    assert [b.mean for b in w.buckets] == [32.0, 96.0, 192.0]
    # two buckets: a quarter on (0, 100], three quarters on (100, 200]
    w = ppo(response_len=200, quantiles=((0.25, 100), (1.0, 200)))
    assert w.buckets == (LengthBucket(0.25, 0, 100), LengthBucket(0.75, 100, 200))
    assert w.mean_response == pytest.approx(0.25 * 50 + 0.75 * 150) == 125.0
    assert w.tokens_per_step == pytest.approx(64 * (128 + 125)) == 16_192
    assert w.padded_tokens_per_step == 64 * 328
    # E[r²] of the uniform law on (lo, hi]: (lo² + lo·hi + hi²)/3
    assert w.buckets[1].mean_square == pytest.approx((100**2 + 100 * 200 + 200**2) / 3)
    assert w.buckets[0].mean_square == pytest.approx(100**2 / 3)
    # every response at full length: Ē = Lr's bucket mean, never above Lr
    one = ppo(response_len=10, quantiles=((1.0, 10),))
    assert one.mean_response == 5.0 and one.tokens_per_step == 64 * (128 + 5)
    assert ppo(batch=8, rollouts=4).tokens_per_step == pytest.approx(32 * (128 + 78.4))


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
        # SPEC §14 fields
        ({"reward": "llm"}, r"workload\.reward must be"),
        ({"reward": "rule"}, r"models\.reward"),  # a rule reward with a reward model
        ({"reward_cost_s": -1.0}, "reward_cost_s"),
        ({"reward_cost_s": 1e6}, "reward_cost_s"),
        ({"reward_cost_s": True}, "reward_cost_s"),
        ({"reward_cost_s": 2.0}, "reward_cost_s"),  # only with a rule reward
        ({"kl_coef": -0.1}, "kl_coef"),
        ({"kl_coef": float("nan")}, "kl_coef"),
        ({"kl_coef": "0.1"}, "kl_coef"),
        ({"kl_coef": 0.0, "models": {"actor": M7, "critic": M7, "reward": M7, "reference": M7}}, "reference"),
        ({"old_logprob": "critic"}, "old_logprob"),
        ({"mini_batches": 0}, "mini_batches"),
        ({"mini_batches": 65}, "mini_batches"),  # more updates than B·R = 64 sequences
        ({"mini_batches": 2.0}, "mini_batches"),
        ({"mini_batches": True}, "mini_batches"),
    ],
)
def test_bad_fields_are_named(kw, field):
    with pytest.raises(ValueError, match=field):
        ppo(**kw)


def test_dpo_needs_pairs():
    with pytest.raises(ValueError, match="rollouts"):
        Workload("dpo", {"actor": M7}, 64, 1, 128, 128)


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"reward": "rule"}, "reward"),
        ({"kl_coef": 0.1}, "kl_coef"),
        ({"old_logprob": "trainer"}, "old_logprob"),
    ],
)
def test_dpo_takes_no_online_fields(kw, field):
    with pytest.raises(ValueError, match=field):
        Workload("dpo", {"actor": M7}, 64, 2, 128, 128, **kw)
    w = Workload("dpo", {"actor": M7}, 64, 2, 128, 128)
    assert w.kl_coef is None and "reference" in w.roles


def test_rule_reward_has_no_reward_model():
    w = ppo(reward="rule", reward_cost_s=0.5, models={"actor": M7, "critic": M7})
    assert w.roles == ("actor", "critic", "reference")
    assert w.reward_cost_s == 0.5
    g = build_graph(w)
    names = [v.name for v in g.vertices]
    assert names == ["actor_gen", "ref_inf", "critic_inf", "actor_train", "critic_train"]
    assert "reward" not in g.models and "W_reward" not in g.containers
    # the generation yields the rewards, straight to both trainers
    assert "rewards" in g.vertex("actor_gen").outputs
    by_pair = {(e.src, e.dst): set(e.containers) for e in g.data_edges}
    assert "rewards" in by_pair[("actor_gen", "actor_train")]
    assert "rewards" in by_pair[("actor_gen", "critic_train")]


def test_zero_kl_drops_the_reference():
    w = ppo(kl_coef=0.0)
    assert "reference" not in w.models and w.roles == ("actor", "critic", "reward")
    g = build_graph(w)
    names = [v.name for v in g.vertices]
    assert names == ["actor_gen", "reward_inf", "critic_inf", "actor_train", "critic_train"]
    assert "reference" not in g.models
    assert not {"ref_logp", "W_reference"} & set(g.containers)
    assert "ref_logp" not in g.vertex("actor_train").inputs
    # GRPO with a rule reward and no KL (DAPO): a generation and a training, nothing else
    dapo = Workload("grpo", {"actor": M7}, 16, 8, 128, 256, reward="rule", kl_coef=0)
    g = build_graph(dapo)
    assert [(v.name, v.role) for v in g.vertices] == [
        ("actor_gen", Role.GENERATION),
        ("actor_train", Role.TRAINING),
    ]
    assert sorted(g.models) == ["actor"]


def test_trainer_logprobs_add_a_teacher_forced_pass():
    w = ppo(old_logprob="trainer")
    g = build_graph(w)
    names = [v.name for v in g.vertices]
    assert names == [
        "actor_gen",
        "actor_logp",
        "ref_inf",
        "reward_inf",
        "critic_inf",
        "actor_train",
        "critic_train",
    ]
    logp = g.vertex("actor_logp")
    assert logp.role is Role.INFERENCE and g.models[logp.model].trainable
    assert logp.sequences == 64
    # the old log-probs now come from the pass, not from the rollout
    assert "logp" not in g.vertex("actor_gen").outputs
    by_pair = {(e.src, e.dst): set(e.containers) for e in g.data_edges}
    assert by_pair[("actor_gen", "actor_logp")] == {"completions"}
    assert by_pair[("actor_logp", "actor_train")] == {"logp"}
    assert "logp" not in by_pair[("actor_gen", "actor_train")]
    # it scores with the weights the rollout sampled with: a publication from the trainer
    assert {(p.src, p.dst) for p in g.pub_edges} >= {
        ("actor_train", "actor_gen"),
        ("actor_train", "actor_logp"),
    }
    # the default keeps one generation pass and no actor_logp
    assert "actor_logp" not in [v.name for v in build_graph(ppo()).vertices]


def test_new_fields_round_trip_through_to_dict():
    w = ppo(kl_coef=0.0, mini_batches=4, old_logprob="trainer")
    d = w.to_dict()
    assert (d["reward"], d["reward_cost_s"], d["kl_coef"], d["old_logprob"], d["mini_batches"]) == (
        "model",
        0.0,
        0.0,
        "trainer",
        4,
    )


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


# ---------------------------------------------------------------------------- issue 33 (third round)
GRPO_TOML = (
    'algorithm = "grpo"\n[batch]\nprompts = 4\n{rollouts}prompt_len = 8\nresponse_len = 8\n'
    '[models]\nactor = "7b"\nreward = "7b"\n'
)


def test_grpo_needs_at_least_two_rollouts_in_python_and_in_a_file(tmp_path):
    """GRPO's advantage is a response's reward against its group's: with ``rollouts = 1`` it is
    always zero, so such a job was planned and run for nothing."""
    from rpeg.ir.errors import InputError

    with pytest.raises(
        ValueError, match=r"workload\.rollouts must be at least 2 for grpo .*always zero\), got 1"
    ):
        Workload("grpo", {"actor": M7, "reward": M7}, 8, 1, 64, 64)
    assert Workload("grpo", {"actor": M7, "reward": M7}, 8, 2, 64, 64).rollouts == 2
    assert (
        Workload("remax", {"actor": M7, "reward": M7}, 8, 1, 64, 64).rollouts == 1
    )  # its baseline is greedy
    path = tmp_path / "w.toml"
    for line, got in (("rollouts = 1\n", "got 1"), ("", r"got none \(the default is 1\)")):
        path.write_text(GRPO_TOML.format(rollouts=line))
        with pytest.raises(
            InputError, match=rf"w\.toml: field 'batch\.rollouts' must be at least 2 for grpo .*{got}"
        ):
            load_workload(path)
    path.write_text(GRPO_TOML.format(rollouts="rollouts = 2\n"))
    assert load_workload(path).workload.rollouts == 2


def test_numpy_integers_are_taken_and_stored_as_int():
    np = pytest.importorskip("numpy")
    w = Workload(
        "ppo",
        {"actor": M7, "critic": M7, "reward": M7},
        np.int64(64),
        np.int32(1),
        np.int64(128),
        np.uint16(256),
        quantiles=((np.float32(0.5), np.int64(64)), (1.0, np.int64(256))),
        staleness={"actor": [np.int64(0), np.int8(1)]},
        mini_batches=np.int64(2),
        kl_coef=np.float64(0.05),
    )
    ints = [w.batch, w.rollouts, w.prompt_len, w.response_len, w.mini_batches, *w.staleness["actor"]]
    ints += [t for _, t in w.quantiles]
    assert all(type(x) is int for x in ints), ints
    assert (w.batch, w.response_len, w.staleness["actor"], w.quantiles) == (
        64,
        256,
        (0, 1),
        ((0.5, 64), (1.0, 256)),
    )
    __import__("json").dumps(w.to_dict())  # plain numbers all the way to the result file
    with pytest.raises(
        TypeError, match=r"workload\.batch must be a positive integer, got np\.True_|workload\.batch"
    ):
        Workload("ppo", {"actor": M7, "critic": M7, "reward": M7}, np.bool_(True), 1, 8, 8)
    with pytest.raises(TypeError, match=r"workload\.batch must be a positive integer, got True"):
        Workload("ppo", {"actor": M7, "critic": M7, "reward": M7}, True, 1, 8, 8)


def test_load_workload_names_an_argument_that_is_not_a_path():
    with pytest.raises(
        TypeError,
        match=r"load_workload: path must be the path of a workload TOML file \(str or pathlib\.Path\), got NoneType None",
    ):
        load_workload(None)
    with pytest.raises(TypeError, match=r"got int 3"):
        load_workload(3)


DUPLICATE_KEY = (
    'algorithm = "grpo"\n[batch]\nprompts = 4\nrollouts = 4\nprompt_len = 8\nprompts = 8\nresponse_len = 8\n'
    '[models]\nactor = "7b"\nreward = "7b"\n'
)


def test_a_duplicate_key_names_the_file_the_line_and_the_key(tmp_path, capsys):
    """tomllib says only "Cannot overwrite a value (at line 6, column 14)"."""
    from rpeg.cli import main
    from rpeg.ir.errors import InputError

    path = tmp_path / "dup.toml"
    path.write_text(DUPLICATE_KEY)
    pattern = (
        r"dup\.toml, line 6: not valid TOML: key 'prompts' is set twice .*\(the line reads 'prompts = 8'\)"
    )
    with pytest.raises(InputError, match=pattern):
        load_workload(path)
    assert main(["solve", str(path), "--method", "greedy", "--cluster", "1x1x4", "--hardware", "gh200"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and __import__("re").search(pattern, err), err
    # other syntax errors name the line too
    path.write_text('algorithm = "grpo"\n[batch]\nprompts = \n')
    with pytest.raises(
        InputError, match=r"dup\.toml, line 3: not valid TOML: .*\(the line reads 'prompts ='\)"
    ):
        load_workload(path)


def test_a_utf8_byte_order_mark_is_dropped(tmp_path):
    """Some Windows editors start a UTF-8 file with a byte-order mark, which tomllib refuses
    ("Invalid statement (at line 1, column 1)"): rpeg drops it."""
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf" + GRPO_TOML.format(rollouts="rollouts = 4\n").encode())
    wf = load_workload(path)
    assert wf.workload.algorithm == "grpo" and wf.workload.rollouts == 4
