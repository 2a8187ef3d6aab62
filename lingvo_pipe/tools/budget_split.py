"""The split of a layer list into pipeline stages under a memory budget.

`Split(profiles, K, M, recompute, budget, layout)` returns the bounds of
the contiguous split into K x V stages (V = layout.num_virtual_stages)
that minimises the slowest stage's time per micro-batch (re-computation
included, `LayerCosts`) among the splits whose every stage fits the
budget, each stage holding what the layout's table makes it hold
(step_model.PredictPartition with the stage's StageStates): GPipe's
stages hold M micro-batches, 1F1B's stage k at most K - k. Exact, by the
dynamic programming of partitioner.MinMaxPartition, whose constraint is
told the stage's index (`MinMaxSplit`); checked against brute force in
tests/tools/plan_test.py. `LeastPeak` is the smallest per-stage budget
any split fits.

With V > 1 stages per device the budget binds a device, their sum: the
split bounds each stage, and the planner checks the devices after
(plan_search.Evaluate).
"""

from __future__ import annotations

import functools
from typing import Callable, List, Optional, Sequence

from lingvo_pipe.core import partitioner
from lingvo_pipe.tools import layer_profile
from lingvo_pipe.tools import step_model

Profile = layer_profile.LayerProfile
Layout = step_model.Layout


def LayerCosts(profiles: Sequence[Profile], recompute: str) -> List[float]:
  """Time per micro-batch of each layer, re-computation included."""
  again = recompute != 'never'
  return [p.forward_s * (2 if again else 1) + p.backward_s
          for p in profiles]


def MinMaxSplit(costs: Sequence[float], num_parts: int,
                fits: Callable[[int, int, int], bool]) -> List[int]:
  """partitioner.MinMaxPartition with `fits(k, s, e)` told the index k of
  the part costs[s:e]: a stage's memory depends on its place in the
  table (1F1B's stage k holds K - k micro-batches)."""
  return partitioner.MinMaxPartition(costs, num_parts, part_fits=fits)


def _StagePeaks(profiles: Sequence[Profile], num_partitions: int, m: int,
                recompute: str, layout: Layout
                ) -> Callable[[int, int, int], int]:
  """peak(k, s, e): stage k holding layers s..e-1, in the layout's table
  for K = num_partitions devices."""
  s_total = num_partitions * layout.num_virtual_stages
  table = layout.Table(num_partitions, m)
  states = step_model.StageStates(table)

  @functools.lru_cache(maxsize=None)
  def Peak(k: int, s: int, e: int) -> int:
    return step_model.PredictPartition(
        profiles[s:e], m, step_model.KeepsActivations(recompute, k, s_total),
        k == s_total - 1, states[k], table.split_backward).peak_bytes

  return Peak


def Split(profiles: Sequence[Profile], num_partitions: int, m: int,
          recompute: str = 'always', budget: Optional[int] = None,
          layout: Layout = Layout()) -> List[int]:
  """Bounds of the min-max time split into K x V stages (K =
  num_partitions devices) whose stages all fit `budget`, each holding
  what the layout's table makes it hold.

  Raises partitioner.NoFeasibleSplit if no such split fits.
  """
  peak = _StagePeaks(profiles, num_partitions, m, recompute, layout)
  return _Split(profiles, num_partitions * layout.num_virtual_stages,
                recompute, budget, peak)


def _Split(profiles: Sequence[Profile], num_stages: int, recompute: str,
           budget: Optional[int], peak: Callable[[int, int, int], int]
           ) -> List[int]:
  return MinMaxSplit(
      LayerCosts(profiles, recompute), num_stages,
      lambda k, s, e: budget is None or peak(k, s, e) <= budget)


def LeastPeak(profiles: Sequence[Profile], num_partitions: int, m: int,
              recompute: str = 'always', layout: Layout = Layout()) -> int:
  """The smallest per-stage budget any split into K x V stages fits."""
  n, s_total = len(profiles), num_partitions * layout.num_virtual_stages
  peak = _StagePeaks(profiles, num_partitions, m, recompute, layout)
  peaks = sorted({peak(k, s, e) for k in range(s_total)
                  for s in range(n) for e in range(s + 1, n + 1)})
  lo, hi = 0, len(peaks) - 1  # the most any stage can hold always fits
  while lo < hi:
    mid = (lo + hi) // 2
    try:
      _Split(profiles, s_total, recompute, peaks[mid], peak)
      hi = mid
    except partitioner.NoFeasibleSplit:
      lo = mid + 1
  return peaks[lo]
