"""lingvo_pipe: GPipe pipeline parallelism on a Lingvo-style layer library."""
