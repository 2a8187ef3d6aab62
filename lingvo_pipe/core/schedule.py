"""The GPipe schedule: which partition runs which micro-batch, and when.

K partitions, M micro-batches. Forward task F(k, m) runs at clock tick
k + m; backward task B(k, m) runs in reverse, after every forward:

  tick:   0   1   2   3   4   5   6   7
  dev 0:  F0  F1  F2  .   .   B2  B1  B0
  dev 1:  .   F0  F1  F2  B2  B1  B0  .

  (K=2, M=3, digits are micro-batches; F(k, m) at tick k + m, B(k, m)
  at tick 2(M+K-1) - 1 - (k + m).)

Each device runs its tasks strictly in this order; the pipeline enforces
the order with control dependencies, so the executor cannot run all
forwards of one device at once (memory) or re-compute early. A device is
idle for K-1 of its M+K-1 ticks in each direction: the bubble fraction
(K-1)/(M+K-1).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List


@dataclasses.dataclass(frozen=True, order=True)
class Task:
  """One unit of work: phase 'F' or 'B' of micro-batch m on partition k."""
  tick: int
  partition: int
  micro_batch: int
  phase: str


def ForwardTick(k: int, m: int) -> int:
  return k + m


def BackwardTick(k: int, m: int, num_partitions: int,
                 num_micro_batches: int) -> int:
  return 2 * (num_micro_batches + num_partitions - 1) - 1 - (k + m)


def GPipeSchedule(num_partitions: int, num_micro_batches: int,
                  backward: bool = True) -> List[Task]:
  """All tasks of one step, sorted by (tick, partition)."""
  if num_partitions < 1 or num_micro_batches < 1:
    raise ValueError(
        f'GPipeSchedule needs K >= 1 and M >= 1, got K={num_partitions}, '
        f'M={num_micro_batches}.')
  tasks = []
  for k in range(num_partitions):
    for m in range(num_micro_batches):
      tasks.append(Task(ForwardTick(k, m), k, m, 'F'))
      if backward:
        tasks.append(Task(
            BackwardTick(k, m, num_partitions, num_micro_batches), k, m, 'B'))
  return sorted(tasks)


def PerDeviceOrder(num_partitions: int, num_micro_batches: int,
                   backward: bool = True) -> Dict[int, List[Task]]:
  """Partition k -> its tasks in the order it must run them."""
  order: Dict[int, List[Task]] = {k: [] for k in range(num_partitions)}
  for task in GPipeSchedule(num_partitions, num_micro_batches, backward):
    order[task.partition].append(task)
  return order


def BubbleFraction(num_partitions: int, num_micro_batches: int) -> float:
  """Idle fraction of each device: (K-1) / (M+K-1)."""
  return (num_partitions - 1) / (num_micro_batches + num_partitions - 1)


def Timeline(num_partitions: int, num_micro_batches: int,
             backward: bool = True) -> str:
  """The schedule as an ASCII chart, one row per device, one cell per tick."""
  tasks = GPipeSchedule(num_partitions, num_micro_batches, backward)
  num_ticks = max(t.tick for t in tasks) + 1
  cells = [['.'] * num_ticks for _ in range(num_partitions)]
  for t in tasks:
    cells[t.partition][t.tick] = f'{t.phase}{t.micro_batch}'
  width = max(len(c) for row in cells for c in row)
  lines = [f'dev {k}: ' + ' '.join(c.ljust(width) for c in row).rstrip()
           for k, row in enumerate(cells)]
  return '\n'.join(lines)
