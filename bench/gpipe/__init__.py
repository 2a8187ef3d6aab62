"""GPipe overhead and memory in one process: run.py."""
