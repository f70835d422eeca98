"""Stand-alone tools for checking rpeg outputs (standard library only)."""
