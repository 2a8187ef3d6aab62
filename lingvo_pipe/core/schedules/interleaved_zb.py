"""Interleaved zero bubble: interleaved 1F1B whose W's fill its bubbles.

Interleaved 1F1B's order of forwards and backwards (V >= 2 stages a
device, stage s on device s mod K, M a multiple of K), each backward
split in B (the input gradient, handed on at once) and W (the weight
gradient). A W does not follow its B at once: simulated with unit
costs, a device runs its oldest waiting W whenever its next forward or
B is not ready, and the W's left at the end (schedule_search.FillWeights;
torch.distributed.pipelining calls this ZB1P). At most K W's wait on a
device, so it holds at most K micro-batch stages more than interleaved
1F1B does.
"""

from __future__ import annotations

from lingvo_pipe.core import schedule
from lingvo_pipe.core import schedule_search


def InterleavedZeroBubble(num_devices: int, num_micro_batches: int,
                          num_virtual_stages: int) -> schedule.Schedule:
  """Interleaved 1F1B's F and B order, W's filling its idle slots."""
  base = schedule.Interleaved1F1B(num_devices, num_micro_batches,
                                  num_virtual_stages)
  return schedule_search.FillWeights(
      base, max_waiting=[num_devices] * num_devices, name='interleaved_zb')


schedule.Register(schedule.Definition(
    'interleaved_zb', InterleavedZeroBubble, stages_per_device=(2, None),
    splits_backward=True, m_multiple_of_k=True))
