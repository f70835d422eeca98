"""One :class:`~rpeg.runtime.worker.core.Worker` in the test process (a one-rank gloo group, no Ray)
for the worker tests: ``local_worker(binding, vertex)`` builds the worker of ``vertex``'s group
of a one-device plan and leaves its process group afterwards; ``node(binding, vertex)`` is the OP
node the controller would send. Both are the engine calibration's
(:mod:`rpeg.runtime.calibrate.engine_terms`), which times the same nodes."""

from __future__ import annotations

from rpeg.runtime.calibrate.engine_terms import local_worker
from rpeg.runtime.calibrate.engine_terms import op_node as node

__all__ = ["local_worker", "node"]
