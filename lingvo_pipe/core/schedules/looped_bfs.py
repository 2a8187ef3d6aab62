"""Looped BFS: breadth first over looped stages (Lamy-Poirier 2023).

V >= 2 stages a device (with one it is GPipe's table), stage s on
device s mod K as interleaved 1F1B puts them, but a device runs every
micro-batch through its first stage before its next, and the backwards
the same way from its last stage: GPipe's order over each device's
stages in turn. It holds every micro-batch of every stage (GPipe's
memory) and gives a device long runs of one stage's work. K=2, V=2, M=2
(digits are micro-batches, s the stage):

  dev 0:  F0s0 F1s0 F0s2 F1s2 B1s2 B0s2 B1s0 B0s0
  dev 1:       F0s1 F1s1 F0s3 F1s3 B1s3 B0s3 B1s1 B0s1
"""

from __future__ import annotations

from lingvo_pipe.core import schedule

Action = schedule.Action


def LoopedBFS(num_devices: int, num_micro_batches: int,
              num_virtual_stages: int) -> schedule.Schedule:
  """Each device: every forward of its stages, first stage first, then
  every backward, last stage first, micro-batches in reverse."""
  k, m_total, v = num_devices, num_micro_batches, num_virtual_stages
  stage_devices = schedule.LoopedStageDevices(k, v)
  order = []
  for d in range(k):
    stages = [s for s, dev in enumerate(stage_devices) if dev == d]
    forwards = [Action('F', s, m) for s in stages for m in range(m_total)]
    backwards = [Action('B', s, m) for s in reversed(stages)
                 for m in reversed(range(m_total))]
    order.append(tuple(forwards + backwards))
  return schedule.Schedule('looped_bfs', m_total, stage_devices,
                           tuple(order))


schedule.Register(schedule.Definition(
    'looped_bfs', LoopedBFS, stages_per_device=(2, None)))
