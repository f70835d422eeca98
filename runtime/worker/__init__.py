"""The worker: what runs in a worker process, one rank of a worker group (SPEC §11).

* :mod:`~rpeg.runtime.worker.process` — the Ray actor the process runs (the driver's only
  entry);
* :mod:`~rpeg.runtime.worker.core` — :class:`~rpeg.runtime.worker.core.Worker`, the rank's state,
  with its parts :mod:`~rpeg.runtime.worker.ops` (model invocations),
  :mod:`~rpeg.runtime.worker.rollouts` (the vLLM engine), :mod:`~rpeg.runtime.worker.transfers`
  (weights, data, transition moves) and :mod:`~rpeg.runtime.worker.checkpoints`;
* :mod:`~rpeg.runtime.worker.model`, :mod:`~rpeg.runtime.worker.parallel`,
  :mod:`~rpeg.runtime.worker.rl`, :mod:`~rpeg.runtime.worker.task`,
  :mod:`~rpeg.runtime.worker.state` — the decoder stages, TP/FSDP2, the RL math, the synthetic
  task and a cell's tensors;
* :mod:`~rpeg.runtime.worker.memory` — the process's memory probes.

Importing this package imports nothing; its modules import torch.
"""
