"""auto: a table searched from costs, not written by hand.

`schedule_search.Search` builds the table with the shortest simulated
step for the stages' forward, B and W costs under a limit of micro-batches
held per device (the zero-bubble paper's automatic scheduling). As a
layer's schedule ('auto') it searches with unit costs, stage s on device
s mod K; the planner (`plan --schedule=auto`) searches with the measured
costs and writes the table as a .csv file the trainer takes.
"""

from __future__ import annotations

from lingvo_pipe.core import schedule
from lingvo_pipe.core import schedule_search


def UnitCosts(num_devices: int, num_micro_batches: int,
              num_virtual_stages: int) -> schedule.Schedule:
  """The searched table with F = B = W = 1, at most K micro-batches held
  a device (schedule_search.Search's default)."""
  return schedule_search.Search(
      schedule.LoopedStageDevices(num_devices, num_virtual_stages),
      num_micro_batches, name='auto')


schedule.Register(schedule.Definition(
    'auto', UnitCosts, stages_per_device=(1, None), splits_backward=True,
    searched=True))
