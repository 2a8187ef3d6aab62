"""ZB-V: zero bubble at 1F1B's activation memory, two stages a device.

Qi et al. (2024, "Pipeline Parallelism with Controllable Memory") place
2K stages in a V: device d holds stage d on the way down and stage
2K-1-d on the way back, so device 0 holds the first and the last stage
(and the loss). Every backward is split in B (the input gradient, handed
on at once) and W (the weight gradient, whenever the device would idle).
Device d's row, c0 = stage d, c1 = stage 2K-1-d:

  warm-up    2(K-d)-1 x F(c0);  d x [F(c1) F(c0)];  K-d x [F(c1) B(c1) W(c1)]
  steady     [F(c0) B(c0) W(c0) F(c1) B(c1) W(c1)] while forwards are left
  cool-down  d x [B(c0) B(c1)];  K-d x [B(c0) W(c0)];  then the W's left,
             of c1 first

Each slot takes the stage's next micro-batch; a slot past M is skipped.
K=2, M=4 (stages 0 and 3 on device 0, 1 and 2 on device 1; digits are
micro-batches, s the stage):

  dev 0: F0s0 F1s0 F2s0 F0s3 B0s3 W0s3 F1s3 B1s3 W1s3 F3s0 B0s0 W0s0 ...
  dev 1: F0s1 F0s2 F1s1 F1s2 B0s2 W0s2 F2s1 B0s1 W0s1 ...

With F = B = W the steady state has no bubble; a device holds at most
2K micro-batch stages of activations at once, 1F1B's K micro-batches of
a whole device's layers.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

from lingvo_pipe.core import schedule

Action = schedule.Action


def VStageDevices(num_devices: int, num_virtual_stages: int = 2
                  ) -> Tuple[int, ...]:
  """Stage s on device s for s < K, else on device 2K-1-s."""
  k = num_devices
  del num_virtual_stages  # always 2
  return tuple(s if s < k else 2 * k - 1 - s for s in range(2 * k))


class _Row:
  """One device's row; each Put takes its stage's next micro-batch."""

  def __init__(self, num_micro_batches: int):
    self.m = num_micro_batches
    self.actions: List[Action] = []
    self.next: Dict[Tuple[str, int], int] = {}

  def Put(self, *slots: Tuple[str, int]) -> None:
    for phase, stage in slots:
      m = self.next.get((phase, stage), 0)
      if m < self.m:
        self.actions.append(Action(phase, stage, m))
        self.next[(phase, stage)] = m + 1

  def Left(self, phase: str, stage: int) -> int:
    return self.m - self.next.get((phase, stage), 0)


def ZeroBubbleV(num_devices: int, num_micro_batches: int,
                num_virtual_stages: int = 2) -> schedule.Schedule:
  """The ZB-V table (module docstring): 2K stages on K devices."""
  k, m_total = num_devices, num_micro_batches
  order = []
  for d in range(k):
    c0, c1 = d, 2 * k - 1 - d
    row = _Row(m_total)
    for _ in range(2 * (k - d) - 1):
      row.Put(('F', c0))
    for _ in range(d):
      row.Put(('F', c1), ('F', c0))
    for _ in range(k - d):
      row.Put(('F', c1), ('B', c1), ('W', c1))
    while row.Left('F', c1):
      row.Put(('F', c0), ('B', c0), ('W', c0), ('F', c1), ('B', c1),
              ('W', c1))
    for _ in range(d):
      row.Put(('B', c0), ('B', c1))
    for _ in range(k - d):
      row.Put(('B', c0), ('W', c0))
    while row.Left('B', c1) or row.Left('B', c0):
      row.Put(('B', c1), ('B', c0))
    for stage in (c1, c0):
      while row.Left('W', stage):
        row.Put(('W', stage))
    order.append(tuple(row.actions))
  return schedule.Schedule('zb_v', m_total, VStageDevices(k), tuple(order))


schedule.Register(schedule.Definition(
    'zb_v', ZeroBubbleV, placement=VStageDevices, stages_per_device=(2, 2),
    splits_backward=True))
