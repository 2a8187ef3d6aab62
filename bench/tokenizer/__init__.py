"""Subword tokenizers side by side: run.py."""
