"""float32 against bfloat16 training: run.py."""
