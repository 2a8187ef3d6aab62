"""A projection's weight gradient, TF's einsum against ours: run.py."""
