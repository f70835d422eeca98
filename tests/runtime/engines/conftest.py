"""Engine-test fixtures: a tiny seeded Llama checkpoint and a local Ray instance.

Nothing is downloaded: the model is a ``transformers`` ``LlamaForCausalLM`` built from a config
with ``torch.manual_seed(0)`` weights and saved to a temporary directory.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

#: The tiny Llama of the engine tests. ``head_dim=32``: vLLM-CPU's attention kernels have no head
#: size 16 (hidden_size / heads of this config), so the head width is set explicitly.
TINY_LLAMA: dict[str, Any] = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 256,
}


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """``(checkpoint directory, float32 LlamaForCausalLM in eval mode)``: :data:`TINY_LLAMA`
    with ``torch.manual_seed(0)`` weights, saved with ``save_pretrained(safe_serialization=True)``.
    Tests must not modify the returned model (load a copy of its state instead)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    directory = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY_LLAMA)).float().eval()
    model.save_pretrained(directory, safe_serialization=True)
    return directory, model


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    """The ``ray`` module, connected: the running instance if one is (left running), else a local
    instance with 2 CPUs (:func:`rpeg.runtime.driver.runner.start_local_ray`: no dashboard, workers at
    the driver's priority), shut down after the module."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        yield ray
        return
    from rpeg.runtime.driver.runner import start_local_ray

    start_local_ray(1, num_cpus=2)
    try:
        yield ray
    finally:
        ray.shutdown()
