"""Memory per device: one measurement per name.

  .venv/bin/python -m bench.memory.run MEASUREMENT [flags]

  table1     the paper's Table 1: the largest model that trains within a
             budget per device, naive and pipelined (table1.py)
  schedules  each schedule's activation peak per device at a fixed
             micro-batch size (schedules.py)

`python -m bench.memory.run MEASUREMENT --help` lists its flags.
"""

import sys

from bench.common import cli

MEASUREMENTS = {
    'table1': 'bench.memory.table1',
    'schedules': 'bench.memory.schedules',
}

if __name__ == '__main__':
  cli.Dispatch(__doc__, MEASUREMENTS, sys.argv[1:])
