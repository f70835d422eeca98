"""``rpeg.run`` / ``rpeg.verify`` are the functions, loaded lazily (no torch or Ray at import)."""

import subprocess
import sys


def test_lazy_front_door_functions_survive_submodule_imports():
    code = (
        "import sys, rpeg, rpeg.cli\n"
        "assert 'torch' not in sys.modules and 'ray' not in sys.modules\n"
        "rpeg.cli._parser()  # imports rpeg.runtime.trace.verify (the module) on the way\n"
        "for _ in range(2):\n"
        "    assert callable(rpeg.run) and rpeg.run.__name__ == 'run'\n"
        "    assert callable(rpeg.verify) and rpeg.verify.__name__ == 'verify'\n"
        "import rpeg.runtime as rt\n"
        "assert callable(rt.run) and rt.run is rpeg.run\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
