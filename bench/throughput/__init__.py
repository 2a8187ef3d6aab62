"""The paper's Table 2 on this machine: run.py."""
