"""The pluggable solver interface: ``solve()``, the method registry and :class:`Result`.

Importing this package registers the built-in methods: ``greedy`` and ``concurrent``
(:mod:`.solve`) and ``sa`` (:mod:`.sa`).
"""

from . import dp as _dp  # noqa: F401  (registers "dp")
from . import exact as _exact  # noqa: F401  (registers "cpsat", "milp")
from . import sa as _sa  # noqa: F401  (registers "sa")
from .result import FORMAT, Result, Status
from .solve import METHODS, Problem, register, solve

__all__ = ["FORMAT", "METHODS", "Problem", "Result", "Status", "register", "solve"]
