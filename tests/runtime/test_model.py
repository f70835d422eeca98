"""Tests of ``runtime/worker/model.py``: shapes, seeded weights, KV-cache decoding, pipeline stages, layout-
independent sampling and tensor parallelism."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rpeg.ir.models import model_preset
from rpeg.ir.types import Head
from rpeg.runtime.binding import scale_spec
from rpeg.runtime.worker.model import (
    KVCache,
    StageModel,
    generate,
    sample_token,
    token_logprobs,
)

V = 16


@pytest.fixture(scope="module")
def spec():
    return scale_spec(model_preset("llama2-7b"), "tiny", vocab=V, min_layers=4)


def tokens(b: int, s: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, V, (b, s), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------- specs
def test_scale_spec_tiny_and_small_shapes():
    base = model_preset("llama2-70b")  # GQA, gated FFN
    tiny = scale_spec(base, vocab=V)
    assert (tiny.layers, tiny.hidden, tiny.heads, tiny.kv_heads, tiny.head_dim) == (2, 64, 4, 4, 16)
    assert (tiny.ffn_hidden, tiny.vocab, tiny.ffn_projections) == (128, V, 3)
    small = scale_spec(base, "small", vocab=V, min_layers=6, tp=2)
    assert (small.layers, small.hidden, small.heads, small.ffn_hidden) == (6, 128, 8, 256)
    wide = scale_spec(base, vocab=V, tp=8)
    assert (wide.heads, wide.hidden, wide.head_dim) == (8, 128, 16)
    gpt = scale_spec(model_preset("175b"), vocab=V)
    assert gpt.ffn_projections == 3 and gpt.tied_embeddings  # runs gated (the family's FFN)


def test_scale_spec_dict_and_errors():
    s = scale_spec(model_preset("7b"), {"layers": 3, "hidden": 32, "heads": 2}, vocab=V)
    assert (s.layers, s.hidden, s.heads, s.kv_heads, s.head_dim, s.ffn_hidden) == (3, 32, 2, 2, 16, 64)
    with pytest.raises(ValueError, match=r"scale='huge'.*tiny, small"):
        scale_spec(model_preset("7b"), "huge", vocab=V)
    with pytest.raises(ValueError, match="heads=2 is not divisible by tp=4"):
        scale_spec(model_preset("7b"), {"hidden": 32, "heads": 2}, vocab=V, tp=4)
    with pytest.raises(ValueError, match="unknown field 'depth'"):
        scale_spec(model_preset("7b"), {"depth": 3}, vocab=V)


# ---------------------------------------------------------------------------------------------- forward
def test_shapes_per_head(spec):
    x = tokens(2, 5)
    assert StageModel(spec, Head.LM, seed=0)(x).shape == (2, 5, V)
    assert StageModel(spec, Head.SCALAR, seed=0)(x).shape == (2, 5)
    logits, values = StageModel(spec, Head.BOTH, seed=0)(x)
    assert logits.shape == (2, 5, V) and values.shape == (2, 5)
    mid = StageModel(spec, Head.LM, seed=0, layer_range=(1, 3), first=False, last=False)
    assert mid(torch.zeros(2, 5, spec.hidden)).shape == (2, 5, spec.hidden)
    assert (
        sorted(mid.model.layers) == ["1", "2"]
        and not hasattr(mid.model, "embed_tokens")
        and not hasattr(mid, "lm_head")
    )


def test_weights_depend_on_seed_and_name_only(spec):
    a = StageModel(spec, Head.LM, seed=3).state_dict()
    b = StageModel(spec, Head.BOTH, seed=3).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    c = StageModel(spec, Head.LM, seed=4).state_dict()
    assert not torch.equal(
        a["model.layers.0.self_attn.q_proj.weight"], c["model.layers.0.self_attn.q_proj.weight"]
    )
    assert not torch.equal(
        a["model.layers.0.self_attn.q_proj.weight"], a["model.layers.1.self_attn.q_proj.weight"]
    )
    tied = StageModel(scale_spec(model_preset("175b"), vocab=V), Head.LM, seed=3)
    assert torch.equal(
        tied.lm_head.weight, tied.model.embed_tokens.weight
    )  # equal at init, separate parameters
    assert tied.lm_head.weight is not tied.model.embed_tokens.weight


def test_kv_cache_decoding_matches_full_forward(spec):
    """Prefill 5 tokens, then a 2-token chunk, then 1-token steps: logits equal the full forward
    within 1e-5 (float32, only the summation order differs)."""
    model = StageModel(spec, Head.LM, seed=1)
    x = tokens(3, 10, seed=1)
    with torch.no_grad():
        full = model(x)
        cache = KVCache()
        parts = [model(x[:, :5], cache=cache), model(x[:, 5:7], cache=cache)]
        parts += [model(x[:, t : t + 1], cache=cache) for t in range(7, 10)]
    assert cache.length == 10 and cache.keys[0].shape == (3, spec.kv_heads, 10, spec.head_dim)
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=0)


def test_pipeline_stages_rebuild_the_same_model(spec):
    """Two stages (layers 0–1 | 2–3) hold exactly the single model's weights (key by key) and their
    chained outputs equal the single model's within 1e-6."""
    single = StageModel(spec, Head.BOTH, seed=2)
    s0 = StageModel(spec, Head.BOTH, seed=2, layer_range=(0, 2), first=True, last=False)
    s1 = StageModel(spec, Head.BOTH, seed=2, layer_range=(2, 4), first=False, last=True)
    merged = {**s0.state_dict(), **s1.state_dict()}
    full = single.state_dict()
    assert merged.keys() == full.keys()
    assert all(torch.equal(merged[k], full[k]) for k in full)
    x = tokens(2, 6, seed=2)
    with torch.no_grad():
        (l1, v1), (l2, v2) = single(x), s1(s0(x))
    torch.testing.assert_close(l2, l1, atol=1e-6, rtol=0)
    torch.testing.assert_close(v2, v1, atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------------------------- sampling
def test_generation_is_independent_of_batch_split(spec):
    model = StageModel(spec, Head.LM, seed=5)
    prompts, ids = tokens(6, 4, seed=5), torch.arange(100, 106)
    toks, logp = generate(model, prompts, 6, seed=9, sample_ids=ids)
    assert toks.shape == (6, 10) and logp.shape == (6, 6)
    assert torch.equal(toks[:, :4], prompts)
    parts = [generate(model, prompts[i : i + 3], 6, seed=9, sample_ids=ids[i : i + 3]) for i in (3, 0)]
    assert torch.equal(torch.cat([parts[1][0], parts[0][0]]), toks)
    torch.testing.assert_close(torch.cat([parts[1][1], parts[0][1]]), logp, atol=1e-5, rtol=0)
    # Log-probs are those of a teacher-forced forward over the generated sequence.
    with torch.no_grad():
        forced = token_logprobs(model(toks)[:, 3:9], toks[:, 4:])
    torch.testing.assert_close(forced, logp, atol=1e-5, rtol=0)
    other, _ = generate(model, prompts, 6, seed=10, sample_ids=ids)
    assert not torch.equal(other, toks)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_logprobs_in_chunks_equals_one_log_softmax(monkeypatch, dtype):
    """Chunked over positions, the log-probs and their gradients are those of one full
    ``log_softmax``, and no normalisation sees more than a chunk of logits (SPEC §14.6: no
    float32 copy of all the logits; the regression a full log-softmax would be)."""
    from rpeg.runtime.worker import model as model_module

    g = torch.Generator().manual_seed(3)
    logits = (3 * torch.randn(3, 11, 40, generator=g)).to(dtype).requires_grad_()
    toks = torch.randint(0, 40, (3, 11), generator=g)
    full = torch.log_softmax((logits / 0.7).float(), -1).gather(-1, toks.unsqueeze(-1)).squeeze(-1)
    seen = []
    real = torch.log_softmax
    monkeypatch.setattr(model_module, "LOGPROB_CHUNK_LOGITS", 3 * 2 * 40)  # two positions a chunk
    monkeypatch.setattr(
        model_module.torch, "log_softmax", lambda x, dim: seen.append(x.numel()) or real(x, dim=dim)
    )
    chunked = token_logprobs(logits[:, 2:], toks[:, 2:], temperature=0.7)
    assert chunked.dtype == torch.float32 and chunked.shape == (3, 9)
    assert len(seen) == 5 and max(seen) == 3 * 2 * 40
    torch.testing.assert_close(chunked, full[:, 2:], atol=0, rtol=0)
    (grad,) = torch.autograd.grad(chunked.sum(), logits)
    (grad_ref,) = torch.autograd.grad(full[:, 2:].sum(), logits)
    torch.testing.assert_close(grad, grad_ref)
    # one position per sequence ([b, V] logits) and the refused temperature
    torch.testing.assert_close(token_logprobs(logits[:, 0], toks[:, 0]), real(logits[:, 0].float(), dim=-1).gather(
        -1, toks[:, :1]).squeeze(-1))  # fmt: skip
    with pytest.raises(ValueError, match="temperature must be > 0"):
        token_logprobs(logits, toks, temperature=0.0)


def test_in_token_chunks_takes_c_tokens_of_the_microbatch_at_a_time():
    """SPEC §14.6's ``c`` counts the microbatch's tokens, across its sequences: ``b·r/c`` calls of
    ``c`` tokens, outputs put back in place; with checkpointing the gradients are the same."""
    from rpeg.runtime.worker.model import in_token_chunks

    g = torch.Generator().manual_seed(5)
    hidden = torch.randn(3, 5, 4, generator=g, requires_grad=True)
    toks = torch.randint(0, 4, (3, 5), generator=g)
    sizes = []

    def fn(h, t):
        sizes.append(h.shape[1])
        return (token_logprobs(h, t), h.sum(-1))

    lp, s = in_token_chunks(fn, hidden, toks, 4)
    assert sizes == [4, 4, 4, 3] and lp.shape == s.shape == (3, 5)
    torch.testing.assert_close(lp, token_logprobs(hidden, toks), atol=0, rtol=0)
    torch.testing.assert_close(s, hidden.sum(-1), atol=0, rtol=0)
    (grad,) = torch.autograd.grad(lp.sum(), hidden)
    again = in_token_chunks(fn, hidden, toks, 4, checkpoint=True)[0]
    torch.testing.assert_close(torch.autograd.grad(again.sum(), hidden)[0], grad)
    with pytest.raises(ValueError, match="in_token_chunks: chunk must be a positive integer, got 0"):
        in_token_chunks(fn, hidden, toks, 0)


def test_sample_token_follows_softmax_and_greedy():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]]).repeat(4000, 1)
    tok, logp = sample_token(logits, 0, torch.arange(4000), 0)
    freq = torch.bincount(tok, minlength=4).float() / 4000
    torch.testing.assert_close(freq, torch.softmax(logits[0], -1), atol=0.03, rtol=0)
    torch.testing.assert_close(logp, torch.log_softmax(logits, -1).gather(1, tok[:, None]).squeeze(1))
    greedy, _ = sample_token(logits[:2], 0, torch.arange(2), 0, temperature=0.0)
    assert greedy.tolist() == [3, 3]
    with pytest.raises(ValueError, match="temperature"):
        sample_token(logits[:1], 0, torch.arange(1), 0, temperature=-1.0)


# ---------------------------------------------------------------------------------------------- TP
def _tp_worker(rank: int, init_file: str, spec, expected: torch.Tensor, x: torch.Tensor) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        model = StageModel(spec, Head.LM, seed=7)
        parallelize_module(model, mesh, model.tp_plan())
        local = model.model.layers["0"].self_attn.q_proj.weight.to_local()
        assert local.shape == (spec.q_width // 2, spec.hidden)
        with torch.no_grad():
            logits = model(x)
            cache = KVCache()
            model(x[:, :4], cache=cache)
            step = model(x[:, 4:5], cache=cache)
        assert cache.keys[0].shape[1] == spec.kv_heads // 2  # the cache holds local heads
        torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(step[:, 0], expected[:, 4], atol=1e-5, rtol=0)
    finally:
        dist.destroy_process_group()


def test_tensor_parallel_matches_single_process(tmp_path):
    """Two gloo ranks with the Megatron plan reproduce the single-process logits within 1e-5."""
    spec = scale_spec(
        model_preset("llama2-70b"), {"layers": 2, "hidden": 32, "heads": 4, "kv_heads": 2}, vocab=V
    )
    model = StageModel(spec, Head.LM, seed=7)
    x = tokens(2, 5, seed=7)
    with torch.no_grad():
        expected = model(x)
    mp.start_processes(
        _tp_worker,
        args=(str(tmp_path / "rendezvous"), spec, expected, x),
        nprocs=2,
        start_method="fork",
    )


# ---------------------------------------------------------------------------------------------- recompute
def _saved_bytes_and_grads(spec, recompute: str) -> tuple[int, dict[str, torch.Tensor], torch.Tensor]:
    """Bytes autograd saves for one training forward, the gradients and the loss."""
    model = StageModel(spec, Head.LM, seed=3, recompute=recompute)
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = token_logprobs(model(tokens(2, 12)), tokens(2, 12, seed=1)).sum()
    loss.backward()
    return sum(saved), {n: p.grad.clone() for n, p in model.named_parameters()}, loss.detach()


def test_full_recompute_checkpoints_the_layers_with_the_same_gradients(spec):
    b_none, g_none, l_none = _saved_bytes_and_grads(spec, "none")
    b_full, g_full, l_full = _saved_bytes_and_grads(spec, "full")
    assert b_full < b_none  # only the layers' inputs are kept for the backward
    assert torch.equal(l_none, l_full)
    for name, g in g_none.items():  # the recompute repeats the same kernels: bit for bit
        assert torch.equal(g_full[name], g), name


def test_no_grad_passes_are_not_checkpointed(spec):
    full = StageModel(spec, Head.LM, seed=3, recompute="full")
    plain = StageModel(spec, Head.LM, seed=3)
    with torch.no_grad():
        assert torch.equal(full(tokens(2, 8)), plain(tokens(2, 8)))
    with pytest.raises(ValueError, match="recompute='selective' must be 'none' or 'full'"):
        StageModel(spec, Head.LM, seed=3, recompute="selective")  # the binding maps it first
