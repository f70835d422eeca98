"""``rpeg calibrate``: measure this machine's hardware figures and engine terms
(:mod:`~rpeg.runtime.calibrate.measure`, :mod:`~rpeg.runtime.calibrate.engine_terms`) and fit
the remaining ones in situ from executed plans (:mod:`~rpeg.runtime.calibrate.insitu`); fitted
by :mod:`rpeg.costmodel.fit`. It runs the engines in its own process and plans through the
driver, so it sits above both.
"""
