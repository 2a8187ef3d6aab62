"""1F1B ahead: 1F1B with every stage but the last one forward further on.

1F1B (schedule.OneFOneB) warms device d up with K-1-d forwards, so in
its steady state each forward reaches the next stage just as that stage
needs it: every hand-off lies on the step's critical path. Here device
d < K-1 warms up with K-d forwards (the last device with none, as in
1F1B), then alternates forward and backward as 1F1B does: the next
stage's input is made one forward earlier and its hand-off overlaps a
backward. The price is one micro-batch more in flight on every stage but
the last: K-d+1 on stage d. K=2, M=4 (digits are micro-batches):

  dev 0: F0 F1 F2 B0 F3 B1 .  B2 .  B3
  dev 1: .  F0 B0 F1 B1 F2 B2 F3 B3 .

Why (docs/DESIGN.md section 34): between worker processes a hand-off
waits for its busy core, and 1F1B waits for every forward's hand-off. On
two pinned workers (bench/peers), bench/common's stack at K=2 M=32 took
0.69 s a step with 1F1B, 0.57 s with this table, as with GPipe.
"""

from __future__ import annotations

from lingvo_pipe.core import schedule

Action = schedule.Action


def OneFOneBAhead(num_devices: int, num_micro_batches: int
                  ) -> schedule.Schedule:
  """Device d < K-1: K-d forwards, then one forward and one backward in
  turn, then the backwards left; device K-1: 1F1B's row."""
  k, m_total = num_devices, num_micro_batches
  order = tuple(
      schedule.WarmUpThenAlternate(
          [Action('F', d, m) for m in range(m_total)],
          [Action('B', d, m) for m in range(m_total)],
          k - d if d < k - 1 else 0)
      for d in range(k))
  return schedule.Schedule('1f1b_ahead', m_total,
                           schedule.LoopedStageDevices(k), order)


schedule.Register(schedule.Definition(
    '1f1b_ahead', lambda k, m, v: OneFOneBAhead(k, m)))
