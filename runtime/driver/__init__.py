"""The driver: what runs in the process that calls :func:`rpeg.run` (SPEC §11).

* :mod:`~rpeg.runtime.driver.runner` — ``run``: checks everything it can before any worker starts,
  runs the plan's segments (transitions, the urgent path) and reports;
* :mod:`~rpeg.runtime.driver.controller` — placement groups, the worker processes of each group,
  completion-driven dispatch of the lowered DAG and failure diagnosis;
* :mod:`~rpeg.runtime.driver.pool` — :class:`~rpeg.runtime.driver.pool.WorkerPool`, which keeps
  worker processes between runs, and the local Ray instance;
* :mod:`~rpeg.runtime.driver.liveness` — progress-checked waits, lost workers, signals;
* :mod:`~rpeg.runtime.driver.transition`, :mod:`~rpeg.runtime.driver.recovery` — moving a running
  job between plans, and the urgent path after a lost worker;
* :mod:`~rpeg.runtime.driver.engine_output` — engine output to a log file.

The driver never imports torch or the worker package (an import-linter contract in
``pyproject.toml``): it reaches the workers only through Ray, naming the actor class of
:mod:`rpeg.runtime.worker.process`, which imports the worker inside the worker process. Tensors
the workers return (final weights) arrive through Ray's object store.
"""
