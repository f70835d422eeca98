"""The pluggable solver interface: ``solve()``, the method registry and :class:`Result`.

Importing this package registers the built-in methods: ``greedy`` and ``concurrent``
(:mod:`.solve`), ``sa`` (:mod:`.sa`), ``dp`` (:mod:`.dp`), ``cpsat`` and ``milp``
(:mod:`.exact`). Every method gets a :class:`Problem` (checked once, when built) and returns a
:class:`Result` built with :meth:`Result.scored` or :meth:`Result.infeasible`; the contract every
result keeps is tested once for all methods (``tests/solvers/test_contract.py``).
"""

from . import dp as _dp  # noqa: F401  (registers "dp")
from . import exact as _exact  # noqa: F401  (registers "cpsat", "milp")
from . import sa as _sa  # noqa: F401  (registers "sa")
from .result import FORMAT, Result, Status
from .solve import METHODS, Problem, clear_caches, register, solve

__all__ = ["FORMAT", "METHODS", "Problem", "Result", "Status", "clear_caches", "register", "solve"]
