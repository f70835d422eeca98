"""Runtime (to come): persistent Ray workers that execute a plan with real PyTorch models,
completion-driven dispatch and trace verification (SPEC §11)."""
