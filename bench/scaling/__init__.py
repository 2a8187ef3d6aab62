"""Pipeline scaling across worker processes: run.py."""
