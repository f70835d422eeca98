"""Heuristic planners over the shared scorer (:mod:`rpeg.scoring`): the greedy and concurrent
baselines (SPEC §8), simulated annealing (:mod:`.search`), the dynamic-programming planner
(:mod:`.dp_planner`, SPEC §10) and the transition heuristics."""

from .baselines import Infeasible, TimeUp, concurrent_plan, greedy_plan, repair_memory

__all__ = ["Infeasible", "TimeUp", "concurrent_plan", "greedy_plan", "repair_memory"]
