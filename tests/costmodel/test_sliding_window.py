"""The cost model on sliding-window attention layers (SPEC §15.1, docs/cost-model.md §9): a
windowed block attends to ``min(c, W)`` keys at context ``c`` and caches ``min(c, W)`` tokens per
sequence; the figures are checked by hand on a two-layer toy, against numerical integrals over
the response-length law, and against the full-attention reading where the window covers every
sequence. A model without a window keeps its figures bit for bit (the rest of the suite pins
them)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rpeg import Cluster, Workload, hardware_preset, model_preset, solve
from rpeg.costmodel.flops import (
    attention_core_flops,
    decode_flops,
    decode_flops_at,
    forward_flops,
    generation_flops,
    head_flops_per_token,
    inference_flops,
    prefill_flops,
    training_flops,
    training_passes,
)
from rpeg.costmodel.layout import Layout
from rpeg.costmodel.memory import (
    generation_engine_bytes,
    kv_budget_tokens,
    kv_bytes_per_token,
    kv_cache_bytes,
    kv_scalars_per_device,
    transient_bytes,
)
from rpeg.costmodel.time import _decode_terms, _Node, decode_schedule, generation_times, op_time
from rpeg.ir import ModelSpec, Strategy
from rpeg.ir.types import Head, Role
from rpeg.ir.workload import LengthBucket
from rpeg.scoring.evaluator import Evaluator

#: Two blocks, the first windowed with W = 4: d_q = 4·16 = 64, d_kv = 2·16 = 32.
TOY = ModelSpec("toy", 2, 64, 128, 100, 4, 2, sliding_window=4, sliding_layers=(0,))
FULL = dataclasses.replace(TOY, sliding_window=0, sliding_layers=())
OSS = model_preset("gpt-oss-20b")
H100 = hardware_preset("h100")


def _unwindowed(spec: ModelSpec) -> ModelSpec:
    return dataclasses.replace(spec, sliding_window=0, sliding_layers=())


def test_a_windowed_pass_by_hand():
    """ℓ = 10, W = 4: the full block's core is 2·d_q·ℓ² = 2·64·100, the windowed block's
    2·d_q·(ℓ² − (ℓ − W)²) = 2·64·64; the matmuls and the head are those of full attention."""
    dq, h = 64, head_flops_per_token(TOY)
    matmuls = 2 * 2 * TOY.layer_params * 10
    assert attention_core_flops(TOY, 10) == 2 * dq * (100 + 64)
    assert forward_flops(TOY, 10) == pytest.approx(matmuls + 2 * dq * (100 + 64) + h * 10, rel=1e-15)
    assert forward_flops(FULL, 10) - forward_flops(TOY, 10) == pytest.approx(2 * dq * 36)
    # within the window nothing changes
    assert forward_flops(TOY, 4) == forward_flops(FULL, 4)
    # the prefill's blocks run the same pass over the prompt, its head on one position
    assert prefill_flops(TOY, sequences=3, prompt_len=10) == pytest.approx(
        3 * (matmuls + 2 * dq * 164 + h), rel=1e-15
    )
    # packed lengths: E[s_W(ℓ)] given, or the upper bound s_W(√E[ℓ²]) from the moments
    assert attention_core_flops(TOY, 10, 120.0, 70.0) == 2 * dq * (120 + 70)
    assert attention_core_flops(TOY, 10, 120.0) == pytest.approx(2 * dq * (240 - (120**0.5 - 4) ** 2))
    assert attention_core_flops(TOY, 3, 10.0) == 2 * dq * (10 + 10)  # √10 < W: the window is not reached


def test_a_windowed_decode_step_by_hand():
    """At context c = 10 a decode step attends to 10 keys in the full block and 4 in the
    windowed one; over steps at contexts 2..8 the windowed block's mean is ∫ min(x, 4)/6 =
    (6 + 16)/6."""
    dq, h = 64, head_flops_per_token(TOY)
    step = 2 * 2 * TOY.layer_params + h  # two blocks' matmuls and the head
    assert decode_flops_at(TOY, sequences=1, steps=1, context=10) == pytest.approx(
        step + 4 * dq * (10 + 4), rel=1e-15
    )
    assert decode_flops_at(FULL, sequences=1, steps=1, context=10) == pytest.approx(step + 4 * dq * 20)
    assert TOY.windowed_mean(2, 8) == pytest.approx(22 / 6)
    assert decode_flops(TOY, sequences=1, prompt_len=2, window=(0, 6)) == pytest.approx(
        6 * (step + 4 * dq * (5 + 22 / 6)), rel=1e-15
    )
    assert TOY.windowed_mean(6, 6) == 4 and TOY.windowed_mean(1, 3) == 2  # one context; below W


@pytest.mark.parametrize(("prompt", "response"), [(2, 6), (10, 5), (3, 1), (1, 40)])
def test_generation_does_the_work_of_a_teacher_forced_pass(prompt, response):
    """Prefill plus the whole decode attend as much as one teacher-forced pass over Lp + Lr
    (∫₀^ℓ 2·min(x, W) dx = s_W(ℓ)), as they do without a window: the two differ only by the head,
    on one prompt position instead of Lp."""
    for spec in (TOY, FULL):
        gen = generation_flops(spec, sequences=3, prompt_len=prompt, response_len=response)
        inf = inference_flops(spec, sequences=3, prompt_len=prompt, response_len=response)
        assert gen - inf == pytest.approx(3 * head_flops_per_token(spec) * (1 - prompt), rel=1e-9, abs=1e-3)


def test_a_windowed_kv_cache_by_hand():
    """A sequence of 10 tokens caches 10 tokens in the full block and 4 in the windowed one:
    (10 + 4)·2·d_kv scalars of 2 bytes; gpt-oss-20b at 8,192 tokens caches 12·8,192 + 12·128
    token-layers of 2·512 scalars, half of what full attention would."""
    lay = Layout(Strategy((1, 1, 1), 1, 1, 1, 1))
    assert kv_cache_bytes(TOY, lay, sequences=3, prompt_len=6, response_len=4) == 3 * (10 + 4) * 2 * 32 * 2
    assert kv_cache_bytes(FULL, lay, sequences=3, prompt_len=6, response_len=4) == 3 * 20 * 2 * 32 * 2
    one = {
        spec.name: kv_cache_bytes(spec, lay, sequences=1, prompt_len=0, response_len=8192)
        for spec in (OSS, dataclasses.replace(_unwindowed(OSS), name="full"))
    }
    assert one["gpt-oss-20b"] == pytest.approx(
        (12 * 8192 + 12 * 128) * 2 * 512 * 2, rel=1e-15
    )  # 204,472,320 B
    assert one["full"] == 24 * 8192 * 2 * 512 * 2
    assert one["gpt-oss-20b"] / one["full"] == pytest.approx(0.5078125)
    # the rollout engine's least memory holds one sequence's windowed cache
    oss_lay = Layout(Strategy((1, 1, 1), 1, 1, 1, 1, mem_fraction=0.05))
    least = generation_engine_bytes(OSS, oss_lay, H100, prompt_len=0, response_len=8192)
    least_full = generation_engine_bytes(_unwindowed(OSS), oss_lay, H100, prompt_len=0, response_len=8192)
    assert least_full - least == pytest.approx(kv_bytes_per_token(OSS, oss_lay) * (8192 - 128) / 2)


def test_the_cache_fits_more_windowed_sequences():
    """``runnable``: an engine whose cache holds fewer tokens than Lp + Lr can still start a
    windowed model, whose sequence takes ``attended(Lp + Lr)`` of them; the full-attention reading
    cannot."""
    lay = Layout(Strategy((1, 1, 1), 1, 1, 1, 1, mem_fraction=0.6))
    tokens = kv_budget_tokens(OSS, lay, H100)
    assert tokens == kv_budget_tokens(_unwindowed(OSS), lay, H100)  # κ counts every block
    ell = int(tokens * 1.5)  # a sequence longer than the cache, in full-attention tokens
    assert OSS.attended(ell) == pytest.approx((ell + 128) / 2) and OSS.attended(ell) < tokens
    for spec, runs in ((OSS, True), (_unwindowed(OSS), False)):
        w = Workload("grpo", {"actor": spec}, 1, 2, ell // 2, ell - ell // 2, reward="rule", kl_coef=0.0)
        costs = Evaluator(w, Cluster.from_shape("1x1x1", H100)).costs
        gen = next(i for i, v in enumerate(costs.graph.vertices) if v.role is Role.GENERATION)
        assert costs.runnable(gen, lay.strategy) is runs


def _buckets() -> tuple[LengthBucket, ...]:
    return (LengthBucket(0.5, 0, 300), LengthBucket(0.35, 300, 1000), LengthBucket(0.15, 1000, 2000))


def _integral(f, lo: float, hi: float, n: int = 200_000) -> float:
    x = lo + (np.arange(n) + 0.5) * (hi - lo) / n
    return float(np.sum(f(x)) * (hi - lo) / n)


@pytest.mark.parametrize("window", [64, 700, 1500, 4000])
def test_packed_window_square_is_the_law_s_mean(window):
    """``E[s_W(ℓ)]`` of ``ℓ = Lp + r``, ``r`` piecewise uniform: the closed form of
    ``Costs._window_square`` against a midpoint integral, for a window below the prompt, inside
    the responses and above every length (then ``E[ℓ²]``)."""
    lp = 200
    spec = ModelSpec("w", 2, 64, 128, 100, 4, 2, sliding_window=window, sliding_layers=(0,))
    w = Workload(
        "grpo",
        {"actor": spec},
        4,
        2,
        lp,
        2000,
        quantiles=((0.5, 300), (0.85, 1000), (1.0, 2000)),
        reward="rule",
        kl_coef=0.0,
    )
    costs = Evaluator(w, Cluster.from_shape("1x1x1", H100)).costs
    numeric = sum(
        b.share
        * _integral(lambda r: (lp + r) ** 2 - np.maximum(0.0, lp + r - window) ** 2, b.lo, b.hi)
        / (b.hi - b.lo)
        for b in w.buckets
    )
    assert costs._window_square(None, window) == pytest.approx(numeric, rel=1e-8)
    one = w.buckets[1]
    numeric_one = _integral(
        lambda r: (lp + r) ** 2 - np.maximum(0.0, lp + r - window) ** 2, one.lo, one.hi
    ) / (one.hi - one.lo)
    assert costs._window_square(one, window) == pytest.approx(numeric_one, rel=1e-8)
    if window >= lp + 2000:
        assert costs._window_square(None, window) == costs._token_stats(None)[1]


@pytest.mark.parametrize("window", [64, 400, 1500, 5000])
def test_a_full_engine_s_windowed_context(window):
    """In a capped stretch a running sequence's age ``a`` has density ``P(r > a)/Ē``: the
    windowed blocks' mean context ``E[min(Lp + a, W)]`` against a midpoint integral, the cap
    ``b_cap = C/attended(c̄_ss)``, and each drain stretch's mean over its contexts."""
    buckets, prompt = _buckets(), 100
    spec = ModelSpec("w", 3, 64, 128, 100, 4, 2, sliding_window=window, sliding_layers=(0, 2))
    kv = 50_000.0
    segs = decode_schedule(sequences=4096, dp=2, prompt_len=prompt, buckets=buckets, kv_tokens=kv, model=spec)
    mean = sum(b.share * b.mean for b in buckets)

    def survival(a):
        return sum(b.share * np.clip((b.hi - a) / (b.hi - b.lo), 0.0, 1.0) for b in buckets)

    numeric = _integral(lambda a: np.minimum(prompt + a, window) * survival(a), 0.0, 2000.0) / mean
    capped = segs[0]
    assert capped.windowed == pytest.approx(numeric, rel=1e-6)
    assert capped.running / 2 == pytest.approx(kv / spec.attended(capped.context, capped.windowed))
    plain = decode_schedule(sequences=4096, dp=2, prompt_len=prompt, buckets=buckets, kv_tokens=kv)
    assert capped.context == plain[0].context and plain[0].windowed is None
    assert capped.running >= plain[0].running
    for seg, b in zip(segs[1:], buckets, strict=True):
        assert seg.windowed == pytest.approx(
            _integral(lambda c: np.minimum(c, window), prompt + b.lo, prompt + b.hi) / (b.hi - b.lo), rel=1e-6
        )


def _every_cost(spec: ModelSpec) -> list[float]:
    """Times and memory of every role on two layouts, padded and packed, and a paged engine's
    decode."""
    out = []
    for st in (Strategy((1, 1, 8), 8, 1, 1, 2), Strategy((1, 1, 8), 1, 2, 4, 4, recompute="selective")):
        lay = Layout(st, 8)
        for role in Role:
            kw = dict(sequences=64, prompt_len=512, response_len=2048)
            out += [
                op_time(spec, role, lay, H100, **kw).total,
                transient_bytes(spec, role, lay, hardware=H100, **kw),
            ]
            out.append(transient_bytes(spec, role, lay, **kw))
        out.append(
            op_time(
                spec,
                Role.TRAINING,
                lay,
                H100,
                sequences=64,
                prompt_len=512,
                response_len=2048,
                tokens=1500.0,
                tokens_sq=3.1e6,
            ).total
        )
        out += [
            bd.total
            for bd in generation_times(
                spec, lay, H100, sequences=512, prompt_len=512, buckets=_buckets(), split=True
            )
        ]
        out.append(
            training_flops(spec, sequences=8, prompt_len=512, response_len=2048, recompute="selective")
        )
    return out


def test_a_window_as_long_as_the_sequences_changes_nothing():
    """W ≥ Lp + Lr: every time, memory and FLOP figure is full attention's, and so is a plan's
    score in the evaluator (packed moments, KV budget, decode schedule)."""
    wide = dataclasses.replace(OSS, sliding_window=10**6)
    assert _every_cost(wide) == pytest.approx(_every_cost(_unwindowed(OSS)), rel=1e-12)
    cluster = Cluster.from_shape("1x1x8", H100)
    wl = Workload("grpo", {"actor": _unwindowed(OSS)}, 16, 4, 256, 2048, reward="rule", kl_coef=0.0)
    result = solve(wl, cluster, "greedy", seed=0)
    assert result.plan is not None
    again = Evaluator(
        dataclasses.replace(wl, models={"actor": wide}), cluster, result.structure, k_eval=result.k_eval
    )
    assert again.evaluate(result.plan).score == pytest.approx(result.evaluation.score, rel=1e-12)


def test_a_window_shortens_gpt_oss_s_attention_and_cache():
    """The 128-token window on half of gpt-oss's blocks: a 32k-token training pass does less
    attention, a decode reads less cache, and the same plan scores higher than under the
    full-attention reading."""
    full = _unwindowed(OSS)
    core, core_full = attention_core_flops(OSS, 32768), attention_core_flops(full, 32768)
    assert core / core_full == pytest.approx((32768**2 + 2 * 128 * 32768 - 128**2) / (2 * 32768**2))
    lay = Layout(Strategy((1, 1, 8), 1, 1, 8, 1), 8)
    assert (
        op_time(OSS, Role.GENERATION, lay, H100, sequences=64, prompt_len=1024, response_len=16384).total
        < op_time(full, Role.GENERATION, lay, H100, sequences=64, prompt_len=1024, response_len=16384).total
    )
    cluster = Cluster.from_shape("1x1x8", H100)
    wl = Workload("grpo", {"actor": full}, 16, 8, 1024, 16384, reward="rule", kl_coef=0.0)
    result = solve(wl, cluster, "greedy", seed=0)
    assert result.plan is not None and result.feasible
    windowed = Evaluator(
        dataclasses.replace(wl, models={"actor": OSS}), cluster, result.structure, k_eval=result.k_eval
    )
    assert windowed.evaluate(result.plan).score > result.evaluation.score


def test_head_choice_keeps_the_window():
    """The scalar head (a critic from a windowed checkpoint) keeps the blocks' window."""
    assert forward_flops(TOY, 10, Head.SCALAR) == forward_flops(FULL, 10, Head.SCALAR) - 2 * 64 * 36


def test_a_windowed_decode_costs_full_attention_at_the_averaged_context():
    """A decode step of gpt-oss-20b at context 32,768 attends to (32,768 + 128)/2 = 16,448 keys
    per block and reads as many cached tokens per block: its FLOPs, KV-cache reads and time are
    those of the full-attention reading at context 16,448; on a GPU engine the attention kernel
    is bound by its KV reads, so the window saves the reads of 16,320 cached tokens per block."""
    full = _unwindowed(OSS)
    lay = Layout(Strategy((1, 1, 1), 1, 1, 1, 1))
    assert OSS.attended(32768) == 16448
    for n in (1, 64):
        windowed = _decode_terms(_Node(OSS, lay, H100, n), 32768, 3, 3, Head.LM)
        assert windowed == pytest.approx(
            _decode_terms(_Node(full, lay, H100, n), 16448, 3, 3, Head.LM), rel=1e-15
        )
        saved = 3 * n * (32768 - 16448) * kv_scalars_per_device(OSS, 1) * OSS.dtype_bytes * OSS.layers
        longer = _decode_terms(_Node(full, lay, H100, n), 32768, 3, 3, Head.LM)[0]
        assert longer - windowed[0] == pytest.approx(saved / H100.mem_bandwidth, rel=1e-9)
    # over a stretch the windowed blocks' mean context is given: the toy over contexts 2..8
    stretch = _decode_terms(_Node(TOY, lay, H100, 8), 5, 6, 6, Head.LM, TOY.windowed_mean(2, 8))
    assert stretch == pytest.approx(_decode_terms(_Node(FULL, lay, H100, 8), (5 + 22 / 6) / 2, 6, 6, Head.LM))


def test_the_evaluator_prices_packed_windowed_passes_exactly():
    """The cost tables give a training node of packed sequences ``E[s_W(ℓ)]`` of the length law
    (``Costs._window_square``), not the moments' upper bound."""
    spec = ModelSpec("w", 4, 256, 512, 1000, 4, 2, sliding_window=700, sliding_layers=(0, 2))
    q = ((0.5, 300), (0.85, 1000), (1.0, 2000))
    w = Workload("grpo", {"actor": spec}, 4, 2, 200, 2000, quantiles=q, reward="rule", kl_coef=0.0)
    costs = Evaluator(w, Cluster.from_shape("1x1x1", H100)).costs
    train = next(i for i, v in enumerate(costs.graph.vertices) if v.role is Role.TRAINING)
    s = Strategy((1, 1, 1), 1, 1, 1, 1, recompute="selective")
    tokens, tokens_sq = costs._token_stats(None)
    kw = dict(sequences=8, prompt_len=200, response_len=2000, tokens=tokens, tokens_sq=tokens_sq)
    exact = op_time(
        spec, Role.TRAINING, costs.layout(s), H100, window_sq=costs._window_square(None, 700), **kw
    )
    bound = op_time(spec, Role.TRAINING, costs.layout(s), H100, **kw)
    assert costs.op_time(train, s) == exact.total
    assert exact.gemm < bound.gemm


def test_a_decode_window_across_w_takes_the_mean_of_its_contexts():
    """op_time's decode steps at contexts 64..320 with W = 128: the windowed blocks attend to
    E[min(c, 128)] = ((128² − 64²)/2 + 128·192)/256 = 120 keys on average, not min(192, 128)."""
    lay = Layout(Strategy((1, 1, 1), 1, 1, 1, 1))
    assert OSS.windowed_mean(64, 320) == 120
    bd = op_time(OSS, Role.GENERATION, lay, H100, sequences=8, prompt_len=64, response_len=256, prefill=False)
    node = _Node(OSS, lay, H100, 8, served=True)  # a generation engine's, as op_time's
    assert bd.gemm == pytest.approx(_decode_terms(node, 192, 256, 255, Head.LM, 120.0)[0], rel=1e-15)
    assert bd.gemm < _decode_terms(node, 192, 256, 255, Head.LM)[0]


def test_selective_recomputation_repeats_the_windowed_core():
    """f = 3 + A/W_fwd with the windowed core A (training_passes): the non-GEMM term, f times
    the per-pass work, is f/3 of recomputing nothing."""
    spec = ModelSpec("w", 4, 256, 512, 1000, 4, 2, sliding_window=700, sliding_layers=(0, 2))
    kw = dict(sequences=8, prompt_len=200, response_len=2000, tokens=1200.0, tokens_sq=2.0e6, window_sq=1.1e6)
    sel = op_time(
        spec, Role.TRAINING, Layout(Strategy((1, 1, 2), 1, 1, 2, 1, recompute="selective")), H100, **kw
    )
    none = op_time(spec, Role.TRAINING, Layout(Strategy((1, 1, 2), 1, 1, 2, 1, recompute="none")), H100, **kw)
    f = training_passes(spec, "selective", 1200.0, Head.LM, 2.0e6, 1.1e6)
    assert f == pytest.approx(
        3
        + attention_core_flops(spec, 1200.0, 2.0e6, 1.1e6)
        / forward_flops(spec, 1200.0, Head.LM, 2.0e6, 1.1e6)
    )
    assert f < training_passes(spec, "selective", 1200.0, Head.LM, 2.0e6)  # the bound's core is larger
    assert none.nongemm > 0 and sel.nongemm / none.nongemm == pytest.approx(f / 3, rel=1e-12)
