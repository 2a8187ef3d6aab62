"""Predicted time and memory of one PipeliningLayer training step.

From measured per-layer costs (`layer_profile.LayerProfile`) and a split
into K partitions, per partition k and micro-batch:

  F_k  = sum of its layers' forward_s
  B_k  = sum of its layers' backward_s, + F_k if it re-computes its forward
         (recompute 'always'; 'except_last' for all but the last)

Step time is the end of the GPipe schedule (schedule.py) run with these
costs, each task starting when its device's previous task and its inputs
are done (the pipeline's control dependencies, pipeline_run.py):

  F(k, m) after F(k, m-1) on device k and F(k-1, m)
  B(k, m) after the device's previous task and B(k+1, m); B(K-1, m) after
          every F(K-1, *) (the loss needs the whole batch's output)

  K=2 M=2, F = (1, 2), B = (3, 4):
    dev 0:  F0 0-1  F1 1-2                  B1 9-12  B0 13-16
    dev 1:          F0 1-3  F1 3-5  B1 5-9  B0 9-13
    step = 16

plus `overhead_s` per task (the runtime's cost of one partition function
call), and `hop_s[k]` on each dependency across the boundary between
partitions k and k+1: handing the micro-batch's output forward, and its
gradient (the same bytes) back (transfer_profile.py). With hops of 0.5:

    dev 0:  F0 0-1  F1 1-2                      B1 10-13  B0 14-17
    dev 1:            F0 1.5-3.5  F1 3.5-5.5  B1 5.5-9.5  B0 9.5-13.5
    step = 17 Memory of partition k, for one step, in bytes:

  resident   params P_k + optimizer slots S_k
  gradients  P_k with M > 1: the running sum of the micro-batches'
             gradients (with M = 1 they are in W_k)
  kept       M x in_k: each micro-batch's input, held until its backward
             + W_k while one micro-batch is re-computed and differentiated
               (+ (M - 1) x R_k if it keeps activations), at least P_k:
               the backward call adds each gradient to the sum as it is
               made, into the gradient's own buffer, and the old sum, an
               input of the call, lives until the call ends (measured
               2.00 P_k in all, docs/DESIGN.md section 28); W_k counts
               the new sums of the layers already done as their
               gradients
  last       the last partition also holds the whole batch's output
             gradient, M x out, through its backward (the output itself
             is freed once the loss's gradient is made: docs/DESIGN.md
             section 31)
  peak       resident + gradients + kept (+ last); the step memory
             (what a step adds over the memory between steps) is
             gradients + kept

R_k is what the partition's gradient reads from its forward: its layers'
residual_bytes, plus the inputs of its inner layers that their gradients
read (input_read_bytes; the partition's own input is already in M x in_k).
W_k is the most its backward holds at once: while layer j is
differentiated, the residuals of layers 0..j-1 wait, the gradients of
layers after j are done, and layer j holds its own working set, its
measured backward_peak_bytes (its residuals, the gradient's temporaries
and results; residual_bytes + its parameters' bytes where the allocator
keeps no statistics), and its output gradient:
  W_k = max_j  sum_{i<j} (R_i + read_i) + read_j + backward_peak_j
               + out_j + sum_{i>j} P_i
Temporaries and the executor's concurrency are in the measured working
set; the static residuals alone missed both (docs/DESIGN.md section 20).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Sequence, Tuple

from lingvo_pipe.core import schedule
from lingvo_pipe.tools import layer_profile

Profile = layer_profile.LayerProfile


@dataclasses.dataclass(frozen=True)
class PartitionPrediction:
  """One partition's predicted costs (module docstring)."""
  forward_s: float
  backward_s: float
  resident_bytes: int
  gradient_bytes: int
  kept_bytes: int

  @property
  def peak_bytes(self) -> int:
    return self.resident_bytes + self.gradient_bytes + self.kept_bytes

  @property
  def step_bytes(self) -> int:
    """What a step adds on top of the resident model: gradients and the
    kept activations."""
    return self.gradient_bytes + self.kept_bytes


def KeepsActivations(recompute: str, k: int, num_partitions: int) -> bool:
  """As PipeliningLayer: which partitions keep their activations."""
  return recompute == 'never' or (recompute == 'except_last' and
                                  k == num_partitions - 1)


def PartitionResidualBytes(profiles: Sequence[Profile]) -> int:
  """R of one partition's layers (module docstring)."""
  return (sum(p.residual_bytes for p in profiles) +
          sum(p.input_read_bytes for p in profiles[1:]))


def BackwardWorkingBytes(part: Sequence[Profile], is_last: bool) -> int:
  """W: the most one micro-batch's backward holds (module docstring)."""
  earlier, later_params, most = 0, sum(p.param_bytes for p in part), 0
  for j, p in enumerate(part):
    read = p.input_read_bytes if j else 0
    work = (p.backward_peak_bytes if p.backward_peak_bytes is not None
            else p.residual_bytes + p.param_bytes)
    later_params -= p.param_bytes
    # Its output gradient: the next layer's d input, or received; the last
    # partition's are counted with its outputs.
    dy = 0 if is_last and j == len(part) - 1 else p.output_bytes
    most = max(most, earlier + read + work + dy + later_params)
    earlier += p.residual_bytes + read
  return most


def PredictPartition(part: Sequence[Profile], num_micro_batches: int,
                     keeps: bool, is_last: bool) -> PartitionPrediction:
  """One partition of layers `part` (module docstring)."""
  m = num_micro_batches
  fwd = sum(p.forward_s for p in part)
  params = sum(p.param_bytes for p in part)
  working = BackwardWorkingBytes(part, is_last)
  if keeps:
    working += (m - 1) * PartitionResidualBytes(part)
  # The new running sum, beside the old one (gradient_bytes) until the
  # backward call ends.
  kept = m * part[0].input_bytes + max(working, params)
  if is_last:
    kept += m * part[-1].output_bytes
  return PartitionPrediction(
      forward_s=fwd,
      backward_s=sum(p.backward_s for p in part) + (0.0 if keeps else fwd),
      resident_bytes=params + sum(p.slot_bytes for p in part),
      gradient_bytes=params if m > 1 else 0, kept_bytes=kept)


def Predict(profiles: Sequence[Profile], bounds: Sequence[int],
            num_micro_batches: int, recompute: str = 'always'
            ) -> List[PartitionPrediction]:
  """Per partition of the split `bounds` (MinMaxPartition's form)."""
  k_total = len(bounds) - 1
  return [PredictPartition(profiles[a:b], num_micro_batches,
                           KeepsActivations(recompute, k, k_total),
                           k == k_total - 1)
          for k, (a, b) in enumerate(zip(bounds, bounds[1:]))]


Task = Tuple[str, int, int]  # (phase, partition, micro-batch)


def TaskTimes(forward_s: Sequence[float], backward_s: Sequence[float],
              num_micro_batches: int, overhead_s: float = 0.0,
              hop_s: Sequence[float] = ()
              ) -> Dict[Task, Tuple[float, float]]:
  """(start, end) of every task of the GPipe schedule (module docstring);
  `hop_s` has one entry per boundary (K - 1), or none for free hops."""
  k_total, m_total = len(forward_s), num_micro_batches
  hops = list(hop_s) or [0.0] * (k_total - 1)
  if len(hops) != k_total - 1:
    raise ValueError(f'hop_s has {len(hops)} entries for {k_total} '
                     f'partitions; give one per boundary, {k_total - 1}.')
  end: Dict[Task, float] = {}
  times = {}
  free = [0.0] * k_total
  # Ticks order the tasks so that every dependency is computed first.
  for task in schedule.GPipeSchedule(k_total, m_total):
    k, m = task.partition, task.micro_batch
    if task.phase == 'F':
      deps = [end[('F', k - 1, m)] + hops[k - 1]] if k else []
      cost = forward_s[k]
    elif k == k_total - 1:
      deps = [end[('F', k, j)] for j in range(m_total)]
      cost = backward_s[k]
    else:
      deps = [end[('B', k + 1, m)] + hops[k]]
      cost = backward_s[k]
    start = max([free[k]] + deps)
    key = (task.phase, k, m)
    end[key] = free[k] = start + cost + overhead_s
    times[key] = (start, end[key])
  return times


def StepSeconds(forward_s: Sequence[float], backward_s: Sequence[float],
                num_micro_batches: int, overhead_s: float = 0.0,
                hop_s: Sequence[float] = ()) -> float:
  """The schedule's critical path: when the last task ends."""
  times = TaskTimes(forward_s, backward_s, num_micro_batches, overhead_s,
                    hop_s)
  return max(e for _, e in times.values())


def IdleFraction(forward_s: Sequence[float], backward_s: Sequence[float],
                 num_micro_batches: int, overhead_s: float = 0.0,
                 hop_s: Sequence[float] = ()) -> float:
  """Predicted bubble: idle share of the devices over the step (a hop
  counts as idle: the device waits for it)."""
  step = StepSeconds(forward_s, backward_s, num_micro_batches, overhead_s,
                     hop_s)
  busy = sum(num_micro_batches * (f + b + 2 * overhead_s)
             for f, b in zip(forward_s, backward_s))
  return 1.0 - busy / (len(forward_s) * step) if step > 0 else 0.0
