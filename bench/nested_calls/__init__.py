"""Unrolled layers against nested function calls: run.py."""
