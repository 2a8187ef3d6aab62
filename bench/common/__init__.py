"""Code the benchmarks share: the model (stack), /proc readings (proc),
the two cores' ceiling (cores), the command line (cli)."""
