"""Exact models (to come): CP-SAT and Pyomo/MILP formulations of plan selection with
scheduling and of transition-DAG scheduling, on a general project-scheduling core (SPEC §9)."""
