"""Pipeline scaling across worker processes: one measurement per name.

  .venv/bin/python -m bench.scaling.run MEASUREMENT [flags]

  pipeline   K=1, 2 on two pinned workers over M, and start-up over K
             and M (pipeline.py)
  schedules  GPipe, 1F1B, interleaved 1F1B, ZB-H1, ZB-V, interleaved
             zero bubble, looped BFS and searched tables side by side,
             and a measured picture of each step (schedules.py)
  replicas   data parallelism x pipeline on pinned workers (replicas.py)
  trainer    the trainer on two workers, two cores against one
             (trainer.py)
  cores      what the two cores give numpy, no TensorFlow
             (bench/common/cores.py)

`python -m bench.scaling.run MEASUREMENT --help` lists its flags.
"""

import sys

from bench.common import cli

MEASUREMENTS = {
    'pipeline': 'bench.scaling.pipeline',
    'schedules': 'bench.scaling.schedules',
    'replicas': 'bench.scaling.replicas',
    'trainer': 'bench.scaling.trainer',
    'cores': 'bench.common.cores',
}

if __name__ == '__main__':
  cli.Dispatch(__doc__, MEASUREMENTS, sys.argv[1:])
