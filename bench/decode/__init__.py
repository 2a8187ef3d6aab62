"""Decoding time per token, cached against uncached: run.py."""
