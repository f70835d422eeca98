"""rpeg — plan, schedule and run RL post-training pipelines for LLMs on GPU clusters.

Front door::

    import rpeg
    wf = rpeg.load_workload(rpeg.example_path("ppo-7b-16gpu"))
    cluster = rpeg.Cluster.from_shape("1x4x4", rpeg.hardware_preset("gh200"))
    result = rpeg.solve(wf.workload, cluster, method="concurrent")
    print(result.summary())
    report = rpeg.run(result, steps=4)      # execute it on Ray workers (tiny models, CPU)
    assert not report.problems              # the trace matches the plan
    move = rpeg.plan_transition(result.plan, other.plan, cluster, workload=wf.workload)
    rpeg.run(result, steps=4, transitions=[(2, other)])  # change plan mid-run, state included

Floors (each imports only those below it; docs/architecture.md, checked by import-linter):
:mod:`rpeg.ir` ← :mod:`rpeg.costmodel` ← :mod:`rpeg.scoring` ← :mod:`rpeg.heuristics` ←
:mod:`rpeg.formulations` ← :mod:`rpeg.solvers` ← :mod:`rpeg.adapt` | :mod:`rpeg.runtime` ← ``cli``.
"""

from .costmodel import HARDWARE_PRESETS, hardware_preset, load_hardware
from .examples import example_names, example_path
from .ir import Cluster, Hardware, ModelSpec, Structure, Workload, load_workload, model_preset
from .ir.errors import InputError
from .solvers import METHODS, Result, Status, register, solve
from .solvers.transition import plan_transition

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``rpeg.run`` and ``rpeg.verify`` load the runtime (torch, Ray) only when first used."""
    if name == "run":
        from .runtime.driver.runner import run

        return run
    if name == "verify":
        from .runtime.trace.verify import verify

        return verify
    raise AttributeError(f"module 'rpeg' has no attribute {name!r}")


__all__ = [
    "HARDWARE_PRESETS",
    "METHODS",
    "Cluster",
    "Hardware",
    "InputError",
    "ModelSpec",
    "Result",
    "Status",
    "Structure",
    "Workload",
    "example_names",
    "example_path",
    "hardware_preset",
    "load_hardware",
    "load_workload",
    "model_preset",
    "plan_transition",
    "register",
    "run",
    "solve",
    "verify",
]
