"""The pluggable solver interface: ``solve()``, the method registry and :class:`Result`."""

from .result import FORMAT, Result, Status
from .solve import METHODS, Problem, register, solve

__all__ = ["FORMAT", "METHODS", "Problem", "Result", "Status", "register", "solve"]
