"""vLLM's start-up scan of module globals survives numba (rpeg's compiled cores load llvmlite).

A vLLM CPU worker, when it starts, registers its Triton kernel overrides by reading ``vars(obj)``
of every global of every loaded module. llvmlite's C-library wrapper answered ``__dict__`` with a
C-function wrapper, so ``rpeg calibrate`` failed at its first two-rank engine ("'_lib_fn_wrapper'
object has no attribute 'get'") once the compiled evaluator was loaded;
:func:`rpeg.ir.warmup.quiet_llvmlite_wrapper` fixes that.
"""

from __future__ import annotations

import pytest


def test_vllms_kernel_scan_runs_with_numba_loaded():
    import rpeg.heuristics._transition_kernel
    import rpeg.scoring.fast  # noqa: F401

    dispatcher = pytest.importorskip("vllm.triton_utils.dispatcher")
    if not hasattr(dispatcher, "_rebind_kernels"):
        pytest.skip("this vLLM has no module scan")
    dispatcher._rebind_kernels([])  # what a CPU worker runs at start-up; raised before the fix
