"""What a run leaves behind, and how it is checked (SPEC §11): the trace
(:mod:`~rpeg.runtime.trace.records`, format :mod:`~rpeg.runtime.trace.schema`), checkpoints
(:mod:`~rpeg.runtime.trace.checkpoint`), the verification against the plan
(:mod:`~rpeg.runtime.trace.verify`), the run report with the cost model's predictions
(:mod:`~rpeg.runtime.trace.report`) and their fidelity (:mod:`~rpeg.runtime.trace.fidelity`).

Both sides use it — the driver writes and verifies traces, a worker digests checkpoint files —
and it imports neither (nor torch).
"""
