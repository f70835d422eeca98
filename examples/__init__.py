"""Bundled example workloads (TOML files in this folder); ``rpeg examples`` lists them."""
