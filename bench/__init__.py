"""Benchmarks: one folder each, run from the repository's root as
`python -m bench.<folder>.run ...`; shared code in bench.common."""
