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

from importlib import import_module

__version__ = "0.1.0"

#: Where each public name lives: ``import rpeg`` loads none of them (a worker process, which
#: imports ``rpeg.runtime.worker``, needs no planner); each loads on first use. ``rpeg.run``
#: and ``rpeg.verify`` load the runtime (torch, Ray).
_PUBLIC = {
    "HARDWARE_PRESETS": ".costmodel",
    "hardware_preset": ".costmodel",
    "load_hardware": ".costmodel",
    "example_names": ".examples",
    "example_path": ".examples",
    "Cluster": ".ir",
    "Hardware": ".ir",
    "ModelSpec": ".ir",
    "Structure": ".ir",
    "Workload": ".ir",
    "load_workload": ".ir",
    "model_preset": ".ir",
    "InputError": ".ir.errors",
    "METHODS": ".solvers",
    "Result": ".solvers",
    "Status": ".solvers",
    "register": ".solvers",
    "solve": ".solvers",
    "plan_transition": ".solvers.transition",
    "run": ".runtime.driver.runner",
    "verify": ".runtime.trace.verify",
}


def __getattr__(name: str) -> object:
    """Load public name ``name`` from its module on first use (:data:`_PUBLIC`)."""
    if name not in _PUBLIC:
        raise AttributeError(f"module 'rpeg' has no attribute {name!r}")
    value = getattr(import_module(_PUBLIC[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])


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
