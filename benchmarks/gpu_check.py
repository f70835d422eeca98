"""GPU check: rpeg's H200 figures and its training and log-prob predictions against one GPU.

Two halves, because the GPU machine has torch and transformers but not rpeg's solvers:

``measure`` (on the GPU machine; ``--device cpu --tiny`` runs the same code on a CPU in seconds,
which is what the test suite does)
    1. :func:`rpeg.runtime.calibrate.measure.calibrate` on ``cuda`` (GEMM sweep, HBM copy, one layer's
       non-GEMM work; collectives need two GPUs and are skipped on one) with the ``h200`` preset
       as its base: the calibrated figures beside the preset's.
    2. Qwen2.5-7B (rpeg's preset shape, transformers' ``Qwen2ForCausalLM``, BF16 weights, SDPA
       attention, random weights) on one GPU: a training pass (forward, float32 log-softmax of
       the tokens as the runtime computes it, 16 Mi logits at a time, backward) with and without
       per-layer activation checkpointing (HF gradient checkpointing = rpeg's ``full`` / ``none``
       recomputation), the same with full recomputation and a chunked loss
       (``train-full-chunk``: the LM head over ``CHUNK_GPU`` tokens at a time under activation
       checkpointing, as the runtime runs a plan's ``logits_chunk``, SPEC §14.6), and a log-prob
       pass (forward under ``no_grad``), at several microbatch shapes ``b × ℓ``. Per shape: the
       median of three timed passes after a warm-up, and the peak memory above the
       resident weights (``torch.cuda.max_memory_allocated`` minus the allocated bytes before the
       pass; training's includes the BF16 gradients it creates).
    3. A fused AdamW step over ``N`` float32 parameters: seconds per parameter.
    4. (GPU only) The Megatron-core engine's training step (:func:`~rpeg.runtime.engines.
       megatron_engine.train_step`, which needs CUDA): a small Llama built from
       Hugging Face weights converted by ``hf_to_megatron``, its token log-probabilities against
       the Hugging Face model's on the same GPU, then six steps of Adam on one batch of two
       microbatches (the loss must fall).
    5. (GPU only, ``--megatron``; **has never run on a GPU**) A GRPO-like loop on stage 4's two
       models (:func:`_megatron_rl`): the Hugging Face model samples rollouts, a rule reward
       scores them, Megatron-core's ``train_step`` takes an Adam step on the clipped surrogate
       with group-normalised advantages, the weights are pushed back into the Hugging Face model
       (``megatron_to_hf``), and the two sides' log-probs are compared before each update and
       after each push. Its helpers (rollout, reward, advantages, loss) are tested on CPU.
    6. A decode sweep (**has never run on a GPU**; runs on CPU with the tiny model): tokens/s of
       batched greedy decode at the batch sizes and contexts of :data:`DECODE_ROWS_GPU` with the
       stage-2 model, a transformers ``StaticCache`` and eager PyTorch (:func:`_decode_row`).
       This is a torch decode loop, not vLLM: no CUDA graphs, paged attention or continuous
       batching.

Time on one H200: stages 1–4 took 138 s there (2026-12-04). Stage 6 adds, on rpeg's own h200
prediction of its work, about 13 s of prefill and 4 s of decode (eager HF decode is slower than
that roofline: allow 60 s), stage 5 a few seconds (a 4-layer model): about 4 minutes in all,
well inside 10.

``report`` (here)
    rpeg's predictions for each measured row on the ``h200`` preset and on the calibrated
    figures, side by side with the measurements; the decode sweep beside rpeg's prefill,
    decode (``op_time``) and whole-generation (``generation_times``) times on the preset
    (:func:`predict_decode`); stage 5 in words; writes the ``gpu-check`` section of
    ``benchmarks/RESULTS.md``.

Prediction terms compared (``docs/cost-model.md`` §1, §4): time ``op_time(...).total`` with
``Strategy(dp = pp = tp = mb = 1)`` and ``tokens = ℓ``; training memory
``training_activation_bytes + logits_bytes + 2·N_m`` (the BF16 gradients), log-prob memory
``sb·T·max(2d + 6d/Pt, 2d + 2dff/Pt) + logits_bytes`` (``transient_bytes`` of the inference role
without the ZeRO state); optimizer ``18·N/BW_mem``.

What this does not measure: vLLM (no wheel for the GPU machine fits the 64 MiB it can be sent,
and it cannot download), so the decode sweep is a torch decode loop; collectives (one GPU). Megatron-core is not on the
GPU machine's image: it travels as its wheel, and ``--megatron`` runs stage 4.

Run::

    python benchmarks/gpu_check.py measure --out DIR             # on the GPU machine
    python benchmarks/gpu_check.py report DIR/gpu_measured.json  # here
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: Microbatch shapes ``(b, ℓ)`` measured per pass kind on the GPU (Qwen2.5-7B).
GPU_ROWS: dict[str, list[tuple[int, int]]] = {
    "train-none": [(1, 4096), (2, 4096), (4, 2048), (1, 8192), (1, 16384)],
    "train-full": [(1, 8192), (4, 8192), (1, 16384), (1, 32768)],
    "logprob": [(1, 8192), (8, 4096), (4, 8192), (1, 32768)],
    "train-full-chunk": [(4, 8192), (1, 32768)],
}
#: The same on a CPU with a tiny model (the suite's smoke run of this script).
TINY_ROWS: dict[str, list[tuple[int, int]]] = {
    "train-none": [(1, 32), (2, 16)],
    "train-full": [(1, 32)],
    "logprob": [(2, 32)],
    "train-full-chunk": [(2, 32)],
}
#: Tokens per chunk of a chunked loss (SPEC §14.6's ``c``), on the GPU and in the tiny CPU run.
CHUNK_GPU = 4096
CHUNK_TINY = 16
GPU_MODEL = "qwen2.5-7b"
ADAM_PARAMS_GPU = 1 << 30
ADAM_PARAMS_TINY = 1 << 16
#: Decode sweep rows ``(b, c)``: ``b`` sequences decoding at context ``c`` (the prompt length),
#: ``DECODE_STEPS`` response tokens each; on the GPU (Qwen2.5-7B) and on CPU (tiny model).
#: ``b·c`` stays ≤ 256 Ki tokens so that the prefill of every row takes seconds on an H200.
DECODE_ROWS_GPU: list[tuple[int, int]] = [
    (1, 512),
    (1, 8192),
    (8, 2048),
    (32, 2048),
    (64, 1024),
    (128, 512),
    (16, 8192),
    (128, 2048),
]
DECODE_ROWS_TINY: list[tuple[int, int]] = [(1, 16), (4, 32)]
DECODE_STEPS_GPU, DECODE_STEPS_TINY = 64, 8
#: Decode steps run before the timed ones (kernel selection, allocator warm-up).
DECODE_WARMUP = 2


def _tiny_spec() -> Any:
    from rpeg.ir.models import ModelSpec

    return ModelSpec(
        "tiny-qwen2", layers=2, hidden=64, ffn_hidden=128, vocab=512, heads=4, kv_heads=2, family="qwen2"
    )


# --------------------------------------------------------------------------------------- measure
def _sync(torch: Any, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _mem(torch: Any, device: str) -> tuple[int, int]:
    """(allocated, peak allocated) bytes; (0, 0) on CPU, where torch keeps no such counters."""
    if device != "cuda":
        return 0, 0
    return torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()


def _one_pass(
    torch: Any, model: Any, kind: str, b: int, ell: int, device: str, seed: int, chunk: int = CHUNK_GPU
) -> dict[str, Any]:
    """Time one pass kind at ``b × ℓ`` (median of three after a warm-up) and take its peak memory.
    ``*-chunk`` kinds take the loss ``chunk`` tokens at a time as the runtime does (the LM head
    under activation checkpointing, :func:`~rpeg.runtime.worker.model.in_token_chunks`)."""
    from rpeg.runtime.worker.model import in_token_chunks, token_logprobs

    g = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (b, ell), generator=g).to(device)
    training = kind.startswith("train")
    if training:
        model.train()
        if kind.startswith("train-full"):
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_disable()
    else:
        model.eval()

    def step() -> None:
        model.zero_grad(set_to_none=True)
        if kind.endswith("-chunk"):
            hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state  # final norm applied

            def head(h: Any, t: Any) -> tuple[Any, ...]:
                return (token_logprobs(model.lm_head(h), t),)

            lp = in_token_chunks(head, hidden[:, :-1], ids[:, 1:], chunk, checkpoint=True)[0]
            (-lp.mean()).backward()
        elif training:
            logits = model(input_ids=ids, use_cache=False).logits
            loss = -token_logprobs(logits[:, :-1], ids[:, 1:]).mean()
            loss.backward()
        else:
            with torch.no_grad():
                logits = model(input_ids=ids, use_cache=False).logits
                token_logprobs(logits[:, :-1], ids[:, 1:])

    row: dict[str, Any] = {
        "kind": kind,
        "b": b,
        "ell": ell,
        **({"chunk": chunk} if kind.endswith("-chunk") else {}),
    }
    try:
        model.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        base, _ = _mem(torch, device)
        step()  # warm-up, and the peak of a pass from a state without gradients
        _sync(torch, device)
        _, peak = _mem(torch, device)
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            step()
            _sync(torch, device)
            times.append(time.perf_counter() - t0)
        row.update(seconds=statistics.median(times), times=times, peak_above_weights=peak - base)
    except torch.OutOfMemoryError as exc:
        row.update(oom=str(exc).splitlines()[0][:200])
    finally:
        model.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.empty_cache()
    return row


def _adam(torch: Any, n: int, device: str) -> dict[str, Any]:
    """Seconds of one fused AdamW step over ``n`` float32 parameters (64 tensors)."""
    parts = 64
    params = [torch.zeros(n // parts, device=device, requires_grad=True) for _ in range(parts)]
    for p in params:
        p.grad = torch.ones_like(p)
    opt = torch.optim.AdamW(params, lr=1e-6, fused=device == "cuda")
    opt.step()  # creates the moments
    _sync(torch, device)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        opt.step()
        _sync(torch, device)
        times.append(time.perf_counter() - t0)
    return {"params": n, "seconds": statistics.median(times), "times": times}


def _decode_row(torch: Any, model: Any, b: int, c: int, steps: int, device: str, seed: int) -> dict[str, Any]:
    """One decode-sweep row: ``b`` random prompts of ``c`` tokens prefilled into a static KV cache
    of ``c + steps`` positions (transformers' ``StaticCache``), then ``steps − 1`` greedy decode
    steps of one token per sequence (the prefill yields the first response token). Times the
    prefill and each decode step (synchronised); the first :data:`DECODE_WARMUP` steps are
    not counted in ``decode_s``. Eager PyTorch: no CUDA graphs, no paged attention, no
    continuous batching — what vLLM adds is not in these figures."""
    from transformers import StaticCache

    g = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (b, c), generator=g).to(device)
    row: dict[str, Any] = {"b": b, "c": c, "steps": steps, "warmup": DECODE_WARMUP}
    cache = None
    try:
        if device == "cuda":
            torch.cuda.empty_cache()
        model.eval()
        cache = StaticCache(config=model.config, max_cache_len=c + steps)
        with torch.no_grad():
            _sync(torch, device)
            t0 = time.perf_counter()
            out = model(
                input_ids=ids,
                past_key_values=cache,
                cache_position=torch.arange(c, device=device),
                use_cache=True,
                logits_to_keep=1,
            )
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            _sync(torch, device)
            prefill = time.perf_counter() - t0
            times = []
            for i in range(steps - 1):
                t0 = time.perf_counter()
                out = model(
                    input_ids=nxt,
                    past_key_values=cache,
                    cache_position=torch.tensor([c + i], device=device),
                    use_cache=True,
                    logits_to_keep=1,
                )
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
                _sync(torch, device)
                times.append(time.perf_counter() - t0)
        timed = times[DECODE_WARMUP:]
        row.update(
            prefill_s=prefill,
            step_times=times,
            decode_s=sum(timed),
            timed_steps=len(timed),
            tokens_per_s=b * len(timed) / sum(timed),
        )
    except torch.OutOfMemoryError as exc:
        row.update(oom=str(exc).splitlines()[0][:200])
    finally:
        del cache
        if device == "cuda":
            torch.cuda.empty_cache()
    return row


def rollout(torch: Any, model: Any, prompts: Any, group: int, length: int, generator: Any) -> Any:
    """``group`` sampled responses of ``length`` tokens per prompt (temperature 1, the HF model's
    KV cache): ``[P·group, Lp + length]`` token ids, prompt ``i``'s samples in rows
    ``i·group … i·group + group − 1``. The rollout engine of the RL stage."""
    ids = prompts.repeat_interleave(group, dim=0)
    past = None
    step_in = ids
    with torch.no_grad():
        for _ in range(length):
            out = model(input_ids=step_in, past_key_values=past, use_cache=True)
            past = out.past_key_values
            probs = torch.softmax(out.logits[:, -1].float(), dim=-1)
            nxt = torch.multinomial(probs.cpu(), 1, generator=generator).to(ids.device)
            ids = torch.cat([ids, nxt], dim=1)
            step_in = nxt
    return ids


def rule_reward(torch: Any, responses: Any, vocab: int) -> Any:
    """The RL stage's rule reward: the share of a response's tokens in the lower half of the
    vocabulary (``id < V/2``), in ``[0, 1]`` per row — learnable, and checkable without a model."""
    return (responses < vocab // 2).float().mean(dim=1)


def grpo_advantages(torch: Any, rewards: Any, group: int) -> Any:
    """GRPO's group-normalised advantages: ``A_i = (r_i − mean_g r)/(std_g r + 1e−6)`` over each
    prompt's ``group`` samples (rows laid out as :func:`rollout` does)."""
    r = rewards.view(-1, group)
    return ((r - r.mean(dim=1, keepdim=True)) / (r.std(dim=1, keepdim=True) + 1e-6)).reshape(-1)


def grpo_loss(torch: Any, logprobs: Any, batch: dict[str, Any], clip: float = 0.2) -> Any:
    """PPO's clipped surrogate with GRPO advantages over the response tokens:
    ``−Σ m·min(ρ·A, clip(ρ, 1 − ε, 1 + ε)·A) / Σ m``, ``ρ = exp(log p − log p_old)``, ``m`` the
    batch's ``loss_mask``, ``A`` its per-sequence ``advantages`` and ``log p_old`` its
    ``old_logprobs`` (the rollout engine's), ``ε = clip``. The ``loss_fn`` of
    :func:`~rpeg.runtime.engines.megatron_engine.train_step`."""
    dev = logprobs.device
    old = batch["old_logprobs"].to(dev)
    adv = batch["advantages"].to(dev)[:, None]
    mask = batch["loss_mask"].to(dev, torch.float32)
    ratio = torch.exp(logprobs.float() - old)
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv)
    return -(surrogate * mask).sum() / mask.sum().clamp(min=1.0)


#: The RL stage: prompts, samples per prompt, prompt and response lengths, iterations, and
#: the sequences per Megatron microbatch (two microbatches per step).
RL_PROMPTS, RL_GROUP, RL_PROMPT_LEN, RL_RESPONSE_LEN, RL_ITERS = 4, 4, 16, 16, 8
RL_MBS = RL_PROMPTS * RL_GROUP // 2


def _megatron_rl(torch: Any, me: Any, hf: Any, model: Any, spec: Any, seed: int) -> dict[str, Any]:
    """Stage 5 (GPU only, never run): a GRPO-like loop on the stage-4 models. Per iteration the
    Hugging Face model (the rollout engine) samples :data:`RL_GROUP` responses per prompt
    (:func:`rollout`), :func:`rule_reward` scores them, :func:`grpo_advantages` normalises per
    group, the engine computes the old log-probs, Megatron-core's ``train_step`` takes one Adam
    step on :func:`grpo_loss` (two microbatches), the Megatron weights are pushed back into the
    engine (``megatron_to_hf`` → ``load_state_dict``), and both sides' log-probs on the
    iteration's sequences are compared before the update and after the push."""
    from rpeg.runtime.worker.model import token_logprobs

    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    n, width = RL_PROMPTS * RL_GROUP, RL_PROMPT_LEN + RL_RESPONSE_LEN
    pos = torch.arange(width - 1, device="cuda").expand(n, width - 1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    iters: list[dict[str, Any]] = []

    def trainer_logprobs(inputs: Any, labels: Any) -> Any:
        model.eval()
        with torch.no_grad():
            return -model(inputs, pos, None, labels=labels)

    for _ in range(RL_ITERS):
        it: dict[str, Any] = {}
        t0 = time.perf_counter()
        prompts = torch.randint(0, spec.vocab, (RL_PROMPTS, RL_PROMPT_LEN), generator=g).cuda()
        seqs = rollout(torch, hf, prompts, RL_GROUP, RL_RESPONSE_LEN, g)
        torch.cuda.synchronize()
        it["generate_s"] = time.perf_counter() - t0
        rewards = rule_reward(torch, seqs[:, RL_PROMPT_LEN:], spec.vocab)
        adv = grpo_advantages(torch, rewards, RL_GROUP)
        inputs, labels = seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()
        mask = torch.zeros_like(labels, dtype=torch.float32)
        mask[:, RL_PROMPT_LEN - 1 :] = 1.0  # labels that are response tokens
        t0 = time.perf_counter()
        with torch.no_grad():
            old = token_logprobs(hf(input_ids=inputs, use_cache=False).logits, labels)
        torch.cuda.synchronize()
        it["old_logprob_s"] = time.perf_counter() - t0
        it["gap_engine_vs_trainer"] = float((trainer_logprobs(inputs, labels).float() - old).abs().max())
        micro = [
            {
                "tokens": inputs[i : i + RL_MBS].cpu(),
                "labels": labels[i : i + RL_MBS].cpu(),
                "loss_mask": mask[i : i + RL_MBS].cpu(),
                "old_logprobs": old[i : i + RL_MBS],
                "advantages": adv[i : i + RL_MBS],
            }
            for i in range(0, n, RL_MBS)
        ]
        model.train()
        t0 = time.perf_counter()
        losses = me.train_step(
            model,
            opt,
            micro,
            seq_length=width - 1,
            micro_batch_size=RL_MBS,
            loss_fn=lambda lp, batch: grpo_loss(torch, lp, batch),
        )
        torch.cuda.synchronize()
        it["train_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        state = me.megatron_to_hf([{k: v for k, v in model.state_dict().items()}], spec, tp=1)
        hf.load_state_dict(state, strict=True)
        torch.cuda.synchronize()
        it["push_s"] = time.perf_counter() - t0
        with torch.no_grad():
            engine = token_logprobs(hf(input_ids=inputs, use_cache=False).logits, labels)
        it["gap_after_push"] = float((trainer_logprobs(inputs, labels).float() - engine).abs().max())
        it["moved"] = float((engine - old).abs().max())  # the update changed the policy
        it.update(reward=float(rewards.mean()), losses=losses)
        iters.append(it)
    return {
        "prompts": RL_PROMPTS,
        "group": RL_GROUP,
        "prompt_len": RL_PROMPT_LEN,
        "response_len": RL_RESPONSE_LEN,
        "iterations": iters,
    }


#: The Megatron stage's model: vocabulary a multiple of 128, so that Megatron pads nothing and its
#: softmax is the Hugging Face model's.
MEGATRON_SPEC = dict(
    name="mcore-llama", layers=4, hidden=256, ffn_hidden=512, vocab=1024, heads=8, kv_heads=2
)


def _megatron(torch: Any, out: Path, seed: int) -> dict[str, Any]:
    """Stage 4 (module docstring): converted weights' log-probs and six Adam steps of ``train_step``."""
    import torch.distributed as dist

    from rpeg.ir.models import ModelSpec
    from rpeg.runtime.engines import megatron_engine as me
    from rpeg.runtime.engines.hf_models import family_modules, hf_config
    from rpeg.runtime.worker.model import token_logprobs

    spec = ModelSpec(**MEGATRON_SPEC)
    store = dist.FileStore(tempfile.mkstemp(prefix="rpeg-mcore-store-")[1], 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1)
    try:
        me.initialize_parallel(1, 1)
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(seed)
        torch.manual_seed(seed)
        hf = family_modules(spec.family).ForCausalLM(hf_config(spec, max_positions=256)).float().cuda().eval()
        config = me.transformer_config(spec, tp=1, pp=1, dp=1, microbatches=2)
        model = me.build_gpt_model(spec, config, pre_process=True, post_process=True, max_sequence_length=256)
        state = {k: v.detach().cpu() for k, v in hf.state_dict().items()}
        model.load_state_dict(me.hf_to_megatron(state, spec, tp=1, t=0), strict=True)
        model.cuda()
        g = torch.Generator(device="cpu").manual_seed(seed)
        tokens = torch.randint(0, spec.vocab, (4, 65), generator=g)
        inputs, labels = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        with torch.no_grad():
            ref = token_logprobs(hf(input_ids=inputs.cuda(), use_cache=False).logits, labels.cuda())
            model.eval()
            pos = torch.arange(64, device="cuda").expand(4, 64)
            mine = -model(inputs.cuda(), pos, None, labels=labels.cuda())
        gap = float((mine.float() - ref).abs().max())
        model.train()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        micro = [{"tokens": inputs[i : i + 2], "labels": labels[i : i + 2]} for i in (0, 2)]
        losses = []
        t0 = time.perf_counter()
        for _ in range(6):
            losses.append(me.train_step(model, opt, micro, seq_length=64, micro_batch_size=2))
        torch.cuda.synchronize()
        result = {
            "spec": MEGATRON_SPEC,
            "logprob_gap_vs_hf": gap,
            "mean_logprob_hf": float(ref.mean()),
            "losses": losses,
            "seconds_6_steps": time.perf_counter() - t0,
        }
        try:  # stage 5: its failure must not lose stage 4's figures
            result["rl"] = _megatron_rl(torch, me, hf, model, spec, seed)
        except Exception as exc:
            import traceback

            result["rl"] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-3000:]}
        return result
    finally:
        with contextlib.suppress(Exception):
            me.destroy_parallel()
        dist.destroy_process_group()


def measure(out: Path, device: str, tiny: bool, seed: int = 0, megatron: bool = False) -> Path:
    """Run the stages (module docstring; 4 and 5 only with ``megatron``); write
    ``out/gpu_measured.json``; return its path."""
    import torch
    import transformers

    from rpeg.ir.models import model_preset
    from rpeg.runtime.calibrate.measure import calibrate
    from rpeg.runtime.engines.hf_models import family_modules, hf_config

    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "device": device,
        "tiny": tiny,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "cpu",
        "gpu_memory_bytes": torch.cuda.get_device_properties(0).total_memory if device == "cuda" else None,
    }
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:7.1f} s] {msg}", flush=True)

    log("calibrate")
    try:
        report = calibrate(device=device, base="h200" if device == "cuda" else "cpu", quick=tiny, seed=seed)
        hw_path = out / "gpu_calibrated.json"
        report.hardware.save(hw_path)
        result["calibration"] = {
            "hardware": json.loads(hw_path.read_text()),
            "table": report.table(),
            "samples": report.to_dict(),  # the raw sweep, to refit here
        }
        print(report.table(), flush=True)
    except Exception as exc:  # record and go on: the passes below do not need it
        result["calibration"] = {"error": f"{type(exc).__name__}: {exc}"}
        log(f"calibration failed: {exc}")

    spec = _tiny_spec() if tiny else model_preset(GPU_MODEL)
    rows = TINY_ROWS if tiny else GPU_ROWS
    longest = max(ell for shapes in rows.values() for _, ell in shapes)
    config = hf_config(spec, max_positions=longest)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    config.dtype = str(dtype).removeprefix("torch.")
    log(f"build {spec.name} ({dtype})")
    torch.manual_seed(seed)
    with torch.device(device):
        model = family_modules(spec.family).ForCausalLM(config).to(dtype)
    result["model"] = spec.name
    result["model_params"] = sum(p.numel() for p in model.parameters())
    result["rows"] = []
    for kind, shapes in rows.items():
        for b, ell in shapes:
            row = _one_pass(torch, model, kind, b, ell, device, seed, CHUNK_TINY if tiny else CHUNK_GPU)
            log(json.dumps({k: v for k, v in row.items() if k != "times"}))
            result["rows"].append(row)
            (out / "gpu_measured.json").write_text(json.dumps(result, indent=1))
    steps = DECODE_STEPS_TINY if tiny else DECODE_STEPS_GPU
    result["decode"] = []
    for b, c in DECODE_ROWS_TINY if tiny else DECODE_ROWS_GPU:
        row = _decode_row(torch, model, b, c, steps, device, seed)
        log("decode " + json.dumps({k: v for k, v in row.items() if k != "step_times"}))
        result["decode"].append(row)
        (out / "gpu_measured.json").write_text(json.dumps(result, indent=1))
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    log("AdamW")
    try:
        result["adam"] = _adam(torch, ADAM_PARAMS_TINY if tiny else ADAM_PARAMS_GPU, device)
    except torch.OutOfMemoryError as exc:
        result["adam"] = {"oom": str(exc).splitlines()[0][:200]}
    log(json.dumps(result["adam"]))
    if megatron:
        log("Megatron-core train_step")
        try:
            result["megatron"] = _megatron(torch, out, seed)
        except Exception as exc:  # record and finish: the other stages' figures stand
            import traceback

            result["megatron"] = {
                "error": f"{type(exc).__name__}: {exc}",
                "trace": traceback.format_exc()[-3000:],
            }
        log(json.dumps(result["megatron"])[:3000])
    result["elapsed_s"] = time.perf_counter() - t_start
    path = out / "gpu_measured.json"
    path.write_text(json.dumps(result, indent=1))
    return path


# ---------------------------------------------------------------------------------------- report
def predict(row: dict[str, Any], spec: Any, hw: Any) -> dict[str, float]:
    """rpeg's time and memory for one measured row (module docstring's terms)."""
    from rpeg.costmodel.layout import Layout
    from rpeg.costmodel.memory import (
        logits_bytes,
        model_params,
        training_activation_bytes,
        transient_bytes,
        zero_state_bytes,
    )
    from rpeg.costmodel.time import op_time
    from rpeg.ir.plan import Strategy
    from rpeg.ir.types import Role

    b, ell, kind = row["b"], row["ell"], row["kind"]
    role = Role.TRAINING if kind.startswith("train") else Role.INFERENCE
    recompute = "full" if kind.startswith("train-full") else "none"
    strategy = Strategy(
        (1, 1, 1), dp=1, pp=1, tp=1, mb=1, recompute=recompute, logits_chunk=row.get("chunk", 0)
    )
    layout = Layout(strategy, gpus_per_node=1)
    half = ell // 2
    t = op_time(
        spec,
        role,
        layout,
        hw,
        sequences=b,
        prompt_len=half,
        response_len=ell - half,
        tokens=ell,
        tokens_sq=float(ell * ell),
    )
    if role is Role.TRAINING:
        act = training_activation_bytes(spec, layout, sequences=b, tokens=ell)
        logits = logits_bytes(spec, role, layout, tokens=b * ell)
        memory = act + logits + spec.dtype_bytes * model_params(spec)
    else:
        state = zero_state_bytes(spec, role, layout)
        memory = transient_bytes(
            spec, role, layout, sequences=b, prompt_len=half, response_len=ell - half, tokens=ell
        )
        memory -= state.transient
        logits = logits_bytes(spec, role, layout, tokens=b * ell)
        act = memory - logits
    return {
        "seconds": t.total,
        "gemm": t.gemm,
        "nongemm": t.nongemm,
        "memory": memory,
        "logits": logits,
        "act": act,
    }


def predict_decode(row: dict[str, Any], spec: Any, hw: Any) -> dict[str, float]:
    """rpeg's figures for one decode-sweep row (``b`` sequences, prompt ``c``, ``steps`` response
    tokens, the first :data:`DECODE_WARMUP` decode steps not timed) on one GPU,
    ``Strategy(dp = pp = tp = 1)``:

    * prefill: ``op_time`` of the generation role with ``decode = (0, 0)`` (the prefill alone);
    * timed decode: ``op_time`` with ``prefill = False`` and ``decode = (1 + w, steps)``: the
      ``steps − 1 − w`` decode steps measured, at contexts ``c + 1 + w …``, and
      ``tokens/s = b·(steps − 1 − w)/T``;
    * the whole generation: :func:`~rpeg.costmodel.time.generation_times` of ``b`` prompts of
      ``c`` tokens and responses of exactly ``steps`` tokens, against the measured prefill plus
      every decode step. SPEC §14.1's buckets partition ``(0, t_Q]``, so "exactly ``steps``" is
      the buckets ``(0, steps − 1]`` with share 0 and ``(steps − 1, steps]`` with share 1 (the
      drain then runs ``steps − 1/2`` steps on average). rpeg charges a decode step per
      response token; the measured loop runs one fewer (the prefill's logits give the first).
    """
    from rpeg.costmodel.layout import Layout
    from rpeg.costmodel.time import generation_times, op_time
    from rpeg.ir.plan import Strategy
    from rpeg.ir.types import Role
    from rpeg.ir.workload import LengthBucket

    b, c, steps, w = row["b"], row["c"], row["steps"], row["warmup"]
    layout = Layout(Strategy((1, 1, 1), dp=1, pp=1, tp=1, mb=1), gpus_per_node=1)
    common = dict(sequences=b, prompt_len=c, response_len=steps)
    prefill = op_time(spec, Role.GENERATION, layout, hw, decode=(0, 0), **common).total
    decode = op_time(spec, Role.GENERATION, layout, hw, decode=(1 + w, steps), prefill=False, **common).total
    buckets = [LengthBucket(0.0, 0, steps - 1), LengthBucket(1.0, steps - 1, steps)]
    (whole,) = generation_times(spec, layout, hw, sequences=b, prompt_len=c, buckets=buckets)
    return {
        "prefill_s": prefill,
        "decode_s": decode,
        "tokens_per_s": b * (steps - 1 - w) / decode,
        "generation_s": whole.total,
    }


def decode_lines(data: dict[str, Any], spec: Any, preset: Any) -> list[str]:
    """The decode sweep beside rpeg's :func:`predict_decode` on the ``preset`` figures."""
    rows = data.get("decode")
    if not rows:
        return ["Decode sweep: not in this measurement file (it predates the sweep)."]
    lines = [
        "Decode sweep (transformers `StaticCache`, eager PyTorch, greedy, no CUDA graphs, no paged "
        f"attention or continuous batching; {rows[0]['steps']} response tokens per sequence, the first "
        f"{rows[0]['warmup']} decode steps untimed); rpeg on the {preset.name} preset:",
        "",
        "| b | context c | measured prefill s | rpeg prefill s | measured decode tok/s | rpeg decode tok/s "
        "| rpeg / measured | measured prefill + decode s | rpeg generation_times s | rpeg / measured |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        pred = predict_decode(row, spec, preset)
        if "oom" in row:
            lines.append(
                f"| {row['b']} | {row['c']} | out of memory | {pred['prefill_s']:.3g} | — | "
                f"{pred['tokens_per_s']:,.0f} | — | — | {pred['generation_s']:.3g} | — |"
            )
            continue
        total = row["prefill_s"] + sum(row["step_times"])
        lines.append(
            f"| {row['b']} | {row['c']} | {row['prefill_s']:.3g} | {pred['prefill_s']:.3g} | "
            f"{row['tokens_per_s']:,.0f} | {pred['tokens_per_s']:,.0f} | "
            f"{pred['tokens_per_s'] / row['tokens_per_s']:.2f} | {total:.3g} | {pred['generation_s']:.3g} | "
            f"{pred['generation_s'] / total:.2f} |"
        )
    return lines


def report(measured_path: Path, write: bool = True, section: str = "gpu-check", title: str = "") -> list[str]:
    """Lines of the side-by-side comparison (and the RESULTS.md ``section`` when ``write``),
    headed ``title`` (default: the GPU and the command that reproduces the section)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _bench import write_section

    from rpeg.costmodel import hardware_preset
    from rpeg.ir.hardware import Hardware
    from rpeg.ir.models import model_preset

    data = json.loads(Path(measured_path).read_text())
    spec = _tiny_spec() if data["tiny"] else model_preset(data["model"])
    preset = hardware_preset("h200" if data["device"] == "cuda" else "cpu")
    hws = {"preset": preset}
    cal = data.get("calibration", {})
    if "hardware" in cal:
        hws["calibrated"] = Hardware.from_dict(
            cal["hardware"], source=f"{measured_path}: calibration.hardware"
        )
    gib = 2.0**30
    try:
        shown = Path(measured_path).resolve().relative_to(Path(__file__).resolve().parents[1])
    except ValueError:
        shown = Path(measured_path)
    command = f"python benchmarks/gpu_check.py report {shown}" + (
        f" --section {section}" if section != "gpu-check" else ""
    )
    lines = [
        f"## {title or 'GPU check on one ' + str(data['gpu'])} (`benchmarks/gpu_check.py`)",
        "",
        f"Measured by `python3 benchmarks/gpu_check.py measure --out $OUT --megatron` on the GPU machine "
        f"(commands and wheels: `benchmarks/README.md`); this section by `{command}`.",
        "",
        f"Measured on {data['gpu']} ({(data['gpu_memory_bytes'] or 0) / gib:.0f} GiB), torch {data['torch']}, "
        f"transformers {data['transformers']}, Python {data['python']}; model {data['model']} "
        f"({data['model_params'] / 1e9:.2f}B parameters, {'BF16' if data['device'] == 'cuda' else 'FP32'}); "
        f"the whole script took {data.get('elapsed_s', float('nan')):.0f} s.",
        "",
    ]
    if "hardware" in cal:
        hw_c = hws["calibrated"]
        lines += [
            f"Calibration (`rpeg.runtime.calibrate.measure.calibrate(device={data['device']!r}, base={preset.name!r})`):",
            "",
            f"| figure | {preset.name} preset | calibrated | calibrated / preset |",
            "|---|---:|---:|---:|",
        ]
        for name, unit, scale in (
            ("peak_flops", "TFLOP/s", 1e12),
            ("gamma_m", "rows", 1.0),
            ("gamma_k", "", 1.0),
            ("mem_bandwidth", "TB/s", 1e12),
            ("c_nongemm", "ms", 1e-3),
        ):
            a, c = getattr(preset, name) / scale, getattr(hw_c, name) / scale
            lines.append(f"| {name} ({unit}) | {a:.4g} | {c:.4g} | {c / a if a else float('nan'):.2f} |")
        fit = cal.get("samples", {}).get("gemm_fit")
        if fit:  # recorded from 2026-12-04's second run on
            lines += [
                "",
                f"GEMM fit: relative RMS {fit['rel_rms']:.1%} over {fit['n_samples']} shapes"
                + (
                    f", {fit['n_excluded']} bandwidth- or dispatch-bound shapes left out"
                    if fit.get("n_excluded")
                    else ""
                )
                + ".",
            ]
        lines.append("")
    elif cal:
        lines += [f"Calibration failed: {cal.get('error')}", ""]
    head = (
        "| pass | b × ℓ | measured s | "
        + " | ".join(f"{k} s | {k} / measured" for k in hws)
        + " | measured GiB above weights | rpeg GiB (act + logits [+ grads]) | rpeg / measured |"
    )
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    for row in data["rows"]:
        shape = f"{row['b']} × {row['ell']}"
        preds = {k: predict(row, spec, hw) for k, hw in hws.items()}
        mem = preds["preset"]
        if "oom" in row:
            cells = " | ".join("— | —" for _ in hws)
            lines.append(
                f"| {row['kind']} | {shape} | out of memory | {cells} | — | {mem['memory'] / gib:.1f} | — |"
            )
            continue
        cells = " | ".join(
            f"{p['seconds']:.3g} | {p['seconds'] / row['seconds']:.2f}" for p in preds.values()
        )
        measured_mem = row["peak_above_weights"]
        ratio = f"{mem['memory'] / measured_mem:.2f}" if measured_mem else "—"
        lines.append(
            f"| {row['kind']} | {shape} | {row['seconds']:.3g} | {cells} | {measured_mem / gib:.1f} | "
            f"{mem['memory'] / gib:.1f} ({mem['act'] / gib:.1f} + {mem['logits'] / gib:.1f}) | {ratio} |"
        )
    adam = data.get("adam", {})
    if "seconds" in adam:
        lines += [""]
        for k, hw in hws.items():
            pred = 18.0 * adam["params"] / hw.mem_bandwidth
            lines.append(
                f"AdamW (fused, {adam['params'] / 1e9:.2f}B float32 parameters): measured {adam['seconds']:.4f} s; "
                f"rpeg `18·N/BW_mem` on the {k} figures {pred:.4f} s ({pred / adam['seconds']:.2f} × measured)."
            )
    lines += ["", *decode_lines(data, spec, preset)]
    lines += ["", *megatron_lines(data.get("megatron"))]
    lines += [*rl_lines((data.get("megatron") or {}).get("rl"))]
    print("\n".join(lines))
    if write:
        write_section(section, lines)
    return lines


def megatron_lines(mc: dict[str, Any] | None) -> list[str]:
    """The Megatron-core stage's outcome (stage 4) in words: its log-prob gap against the Hugging
    Face model and whether six Adam steps of ``train_step`` lowered the loss."""
    if not mc:
        return ["Megatron-core `train_step`: not run (`--megatron` not given, or no GPU)."]
    if "error" in mc:
        return [f"Megatron-core `train_step` failed: {mc['error']}"]
    first, last = (sum(step) / len(step) for step in (mc["losses"][0], mc["losses"][-1]))
    verdict = "fell" if last < first else "**did not fall**"
    return [
        f"Megatron-core `train_step` ({mc['spec']['layers']}-layer Llama, d = {mc['spec']['hidden']}, "
        f"converted Hugging Face weights, float32): largest log-prob gap against the Hugging Face model "
        f"{mc['logprob_gap_vs_hf']:.2e} (mean log-prob {mc['mean_logprob_hf']:.3f}); the loss over six Adam "
        f"steps on one batch of two microbatches {verdict}, {first:.4f} → {last:.4f} "
        f"({mc['seconds_6_steps']:.2f} s)."
    ]


def rl_lines(rl: dict[str, Any] | None) -> list[str]:
    """Stage 5's outcome (the GRPO-like loop, :func:`_megatron_rl`) in words: rewards, the
    log-prob agreement of engine and trainer before each update and after each weight push,
    and the phase times."""
    if not rl:
        return [
            "Megatron-core RL loop (stage 5): not run (`--megatron` not given, no GPU, or stage 4 failed)."
        ]
    if "error" in rl:
        return [f"Megatron-core RL loop (stage 5) failed: {rl['error']}"]
    its = rl["iterations"]
    rewards = ", ".join(f"{it['reward']:.3f}" for it in its)

    def worst(key: str) -> float:
        return max(it[key] for it in its)

    def total(key: str) -> float:
        return sum(it[key] for it in its)

    return [
        f"Megatron-core RL loop (stage 5: {len(its)} iterations, {rl['prompts']} prompts × {rl['group']} "
        f"samples, prompt {rl['prompt_len']} and response {rl['response_len']} tokens; rollouts from the "
        "Hugging Face model, rule reward, GRPO advantages, one `train_step` on the clipped surrogate, "
        f"weights pushed back by `megatron_to_hf`): mean reward per iteration {rewards}; largest log-prob "
        f"gap engine vs trainer before an update {worst('gap_engine_vs_trainer'):.2e}, after a push "
        f"{worst('gap_after_push'):.2e}; largest policy change per update {worst('moved'):.2e}; seconds in "
        f"all: generate {total('generate_s'):.2f}, old log-probs {total('old_logprob_s'):.2f}, train "
        f"{total('train_s'):.2f}, push {total('push_s'):.2f}."
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="run the measurements (GPU machine)")
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    m.add_argument("--tiny", action="store_true", help="a tiny model and quick calibration (CPU smoke run)")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--megatron", action="store_true", help="also run the Megatron-core stage (CUDA)")
    r = sub.add_parser("report", help="predictions beside a measurement file (here)")
    r.add_argument("measured", type=Path)
    r.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    r.add_argument("--section", default="gpu-check", help="the RESULTS.md section to write")
    r.add_argument("--title", default="", help="the section's heading")
    args = parser.parse_args(argv)
    if args.cmd == "measure":
        print(measure(args.out, args.device, args.tiny, args.seed, args.megatron))
    else:
        report(args.measured, write=not args.no_write, section=args.section, title=args.title)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
