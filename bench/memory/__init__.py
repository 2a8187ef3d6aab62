"""The paper's Table 1, and each schedule's activations: run.py."""
