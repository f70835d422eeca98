"""What things cost: hardware figures, operator time and per-device memory (SPEC §6).

* :mod:`.hardware` — bundled hardware presets (JSON in ``presets/``) and how to load them;
* :mod:`.collectives` — α–β times of AllReduce, AllGather, ReduceScatter, AlltoAll and P2P;
* :mod:`.flops` — leading-order work of generation, inference and training;
* :mod:`.layout` — :class:`Layout`, a plan's strategy on nodes of ``Ng`` GPUs (what is priced);
* :mod:`.time` — :func:`op_time` for OP nodes, :func:`comm_time` / :func:`reshard_time` for COMM
  and RESHARD nodes;
* :mod:`.memory` — parameter shards, persistent optimizer state and transient peaks;
* :mod:`.transition` — times of the transition primitives (SPEC §10);
* :mod:`.fit` — calibration fits from measured samples to a hardware file (the measuring is
  :mod:`rpeg.runtime.calibrate.measure`).

Nothing here imports torch.

Derivations and assumptions: ``docs/cost-model.md``.
"""

from .collectives import (
    allgather_time,
    allreduce_time,
    alltoall_time,
    flex_dispatch_time,
    hierarchical_alltoall_time,
    p2p_time,
    reduce_scatter_time,
)
from .flops import (
    attention_core_flops,
    decode_flops,
    forward_flops,
    generation_flops,
    head_flops_per_token,
    inference_flops,
    prefill_flops,
    training_flops,
    training_passes,
)
from .hardware import HARDWARE_PRESETS, Hardware, Link, hardware_preset, load_hardware
from .layout import Layout
from .memory import (
    inference_activation_bytes,
    kv_cache_bytes,
    kv_scalars_per_device,
    kv_width_per_device,
    model_params,
    stored_activation_width,
    training_activation_bytes,
    training_state_bytes,
    transient_bytes,
    weight_bytes,
    weight_shard_params,
)
from .time import TimeBreakdown, comm_time, op_time, publication_bytes, reshard_time

__all__ = [
    "HARDWARE_PRESETS",
    "Hardware",
    "Layout",
    "Link",
    "TimeBreakdown",
    "allgather_time",
    "allreduce_time",
    "alltoall_time",
    "attention_core_flops",
    "comm_time",
    "decode_flops",
    "flex_dispatch_time",
    "forward_flops",
    "generation_flops",
    "hardware_preset",
    "head_flops_per_token",
    "hierarchical_alltoall_time",
    "inference_activation_bytes",
    "inference_flops",
    "kv_cache_bytes",
    "kv_scalars_per_device",
    "kv_width_per_device",
    "load_hardware",
    "model_params",
    "op_time",
    "p2p_time",
    "prefill_flops",
    "publication_bytes",
    "reduce_scatter_time",
    "reshard_time",
    "stored_activation_width",
    "training_activation_bytes",
    "training_flops",
    "training_passes",
    "training_state_bytes",
    "transient_bytes",
    "weight_bytes",
    "weight_shard_params",
]
