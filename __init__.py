"""rpeg — plan, schedule and run RL post-training pipelines for LLMs on GPU clusters.

Front door::

    import rpeg
    result = rpeg.solve(workload, cluster, method="concurrent")

Layers (data flows one way): :mod:`rpeg.ir` ← :mod:`rpeg.costmodel` ← :mod:`rpeg.heuristics` /
:mod:`rpeg.formulations` ← :mod:`rpeg.solvers` ← :mod:`rpeg.runtime`.
"""

__version__ = "0.1.0"
