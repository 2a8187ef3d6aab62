"""Tests of the planner: the split under a budget, the predicted step, the
suggestion, its errors, and one run of the command line.

The split is checked against a brute-force enumeration of every contiguous
split, per schedule; the step time against hand-computed simulations of
each schedule's table; what a stage holds against the table's counts.
"""

import dataclasses
import itertools
import os
import random
import re
import subprocess
import sys
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized

from lingvo_pipe.core import devices

devices.SplitCpu(4)

from lingvo_pipe.core import hyperparams  # noqa: E402
from lingvo_pipe.core import model_registry  # noqa: E402
from lingvo_pipe.core import partitioner  # noqa: E402
from lingvo_pipe.core import schedule  # noqa: E402
from lingvo_pipe.core.schedules import registry  # noqa: E402
from lingvo_pipe.tools import budget_split  # noqa: E402
from lingvo_pipe.tools import layer_profile  # noqa: E402
from lingvo_pipe.tools import model_pipeline  # noqa: E402
from lingvo_pipe.tools import plan  # noqa: E402
from lingvo_pipe.tools import plan_search  # noqa: E402
from lingvo_pipe.tools import step_model  # noqa: E402
from lingvo_pipe.tools import transfer_profile  # noqa: E402

MIB = 2**20


def _Profile(i, fwd, bwd, act, params, residual=None):
  """A layer: times in seconds, `act` MiB in and out, `params` MiB."""
  return layer_profile.LayerProfile(
      name=f'layer_{i}', forward_s=fwd, backward_s=bwd,
      residual_bytes=(residual if residual is not None else 3 * act) * MIB,
      input_read_bytes=act * MIB, input_bytes=act * MIB,
      output_bytes=act * MIB, num_params=params * MIB // 4,
      param_bytes=params * MIB, slot_bytes=2 * params * MIB)


def _RandomProfiles(rng, n):
  return [_Profile(i, rng.randint(1, 8) / 8, rng.randint(1, 16) / 8,
                   rng.randint(1, 4), rng.randint(0, 6)) for i in range(n)]


def _Peaks(profiles, bounds, m, recompute, layout=plan_search.Layout()):
  return [p.peak_bytes for p in step_model.Predict(
      profiles, bounds, m, recompute, layout.schedule_name,
      layout.num_virtual_stages)]


def _MaxCost(profiles, bounds, recompute):
  costs = budget_split.LayerCosts(profiles, recompute)
  return max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:]))


def _SplitOrNone(fn, *args):
  try:
    return fn(*args)
  except partitioner.NoFeasibleSplit:
    return None


class SplitTest(parameterized.TestCase):

  @parameterized.product(recompute=('always', 'never', 'except_last'),
                         layout=(plan_search.Layout(),
                                 plan_search.Layout('1f1b'),
                                 plan_search.Layout('interleaved_1f1b', 2)))
  def testOptimalAmongFeasibleSplits(self, recompute, layout):
    rng = random.Random(7)
    v = layout.num_virtual_stages
    for _ in range(40):
      n, k, m = rng.randint(2, 7), rng.randint(1, 4), rng.choice([1, 2, 4])
      k = min(k, n // v)
      if not k or not layout.HasTable(k, m):
        continue
      profiles = _RandomProfiles(rng, n)
      splits = [[0, *cuts, n]
                for cuts in itertools.combinations(range(1, n), k * v - 1)]
      peaks = sorted(max(_Peaks(profiles, s, m, recompute, layout))
                     for s in splits)
      budget = peaks[rng.randrange(len(peaks))]
      feasible = [s for s in splits
                  if max(_Peaks(profiles, s, m, recompute, layout)) <= budget]
      best = min(_MaxCost(profiles, s, recompute) for s in feasible)
      got = budget_split.Split(profiles, k, m, recompute, budget, layout)
      self.assertLessEqual(
          max(_Peaks(profiles, got, m, recompute, layout)), budget)
      self.assertEqual(_MaxCost(profiles, got, recompute), best)
      self.assertEqual(
          budget_split.LeastPeak(profiles, k, m, recompute, layout),
          peaks[0])

  def testSameSplitAsThePartitioner(self):
    # Where a stage's memory does not depend on its index (GPipe, V=1),
    # MinMaxSplit is partitioner.MinMaxPartition, ties included.
    rng = random.Random(3)
    for _ in range(100):
      n = rng.randint(1, 9)
      costs = [rng.randint(0, 4) for _ in range(n)]
      k = rng.randint(1, n)
      limit = rng.randint(1, 4)  # at most `limit` layers a part

      def Fits(s, e, limit=limit):
        return e - s <= limit

      self.assertEqual(
          _SplitOrNone(budget_split.MinMaxSplit, costs, k,
                       lambda _, s, e: Fits(s, e)),
          _SplitOrNone(partitioner.MinMaxPartition, costs, k, Fits))

  def testBudgetMovesTheSplit(self):
    # Four equal layers in time; layer 0 keeps 40 MiB for its backward.
    profiles = [_Profile(0, 1 / 8, 1 / 8, 1, 0, residual=40)] + [
        _Profile(i, 1 / 8, 1 / 8, 1, 0, residual=1) for i in (1, 2, 3)]
    self.assertEqual(budget_split.Split(profiles, 2, 1), [0, 2, 4])
    # Peaks, M=1 'always', no parameters, no measured working sets: input
    # + W (step_model), + the output gradient on the last partition. W:
    # the most, over its layers j, of the earlier layers' residuals and
    # inner inputs read + j's input read + j's residuals + j's output
    # gradient (none for the last layer of the last partition).
    #   [0, 2): 1 + max(40 + 1, 40 + 1 + 1 + 1) = 44 MiB
    #   [0, 1): 1 + (40 + 1) = 42
    #   [2, 4): 1 + max(1 + 1, 1 + 1 + 1) + 1 = 5
    #   [1, 4): 1 + max(2, 1 + 1 + 1 + 1, 3 + 1 + 1) + 1 = 7
    self.assertEqual(_Peaks(profiles, [0, 2, 4], 1, 'always'),
                     [44 * MIB, 5 * MIB])
    self.assertEqual(_Peaks(profiles, [0, 1, 4], 1, 'always'),
                     [42 * MIB, 7 * MIB])
    self.assertEqual(budget_split.Split(profiles, 2, 1, budget=44 * MIB),
                     [0, 2, 4])
    self.assertEqual(budget_split.Split(profiles, 2, 1, budget=43 * MIB),
                     [0, 1, 4])
    self.assertEqual(budget_split.LeastPeak(profiles, 2, 1), 42 * MIB)

  def testMeasuredWorkingSetsAndGradients(self):
    # Two layers, 1 MiB in and out, residuals 3 and 5 MiB, parameters 2 and
    # 4 MiB; measured backward peaks 10 and 12 MiB.
    part = [dataclasses.replace(_Profile(0, 1, 1, 1, 2, residual=3),
                                backward_peak_bytes=10 * MIB),
            dataclasses.replace(_Profile(1, 1, 1, 1, 4, residual=5),
                                backward_peak_bytes=12 * MIB)]
    # Not last. Layer 0: its 10 + its output gradient 1 + layer 1's
    # finished gradients 4 = 15; layer 1: layer 0's residuals 3 + its input
    # read 1 + its 12 + its output gradient 1 = 17.
    self.assertEqual(step_model.BackwardWorkingBytes(part, False), 17 * MIB)
    # Last: layer 1's output gradient is counted with the outputs: 16 > 15.
    self.assertEqual(step_model.BackwardWorkingBytes(part, True), 16 * MIB)
    one = step_model.PredictPartition(part, 1, keeps=False, is_last=False)
    self.assertEqual((one.gradient_bytes, one.kept_bytes),
                     (0, (1 + 17) * MIB))
    # M=4: the running sum of the gradients (6 MiB) besides, 4 inputs.
    four = step_model.PredictPartition(part, 4, keeps=False, is_last=False)
    self.assertEqual((four.gradient_bytes, four.kept_bytes),
                     (6 * MIB, (4 + 17) * MIB))
    self.assertEqual(four.step_bytes, (6 + 4 + 17) * MIB)
    self.assertEqual(four.peak_bytes, (6 + 12 + 6 + 4 + 17) * MIB)
    # Heavier parameters (20 + 20 MiB): the backward call ends holding the
    # old sum and the new one, 2 x 40 MiB, the new one more than the
    # backward's working set (10 + 1 + 20 = 31 MiB).
    heavy = [dataclasses.replace(p, param_bytes=20 * MIB) for p in part]
    self.assertEqual(step_model.BackwardWorkingBytes(heavy, False),
                     31 * MIB)
    four = step_model.PredictPartition(heavy, 4, keeps=False, is_last=False)
    self.assertEqual((four.gradient_bytes, four.kept_bytes),
                     (40 * MIB, (4 + 40) * MIB))
    one = step_model.PredictPartition(heavy, 1, keeps=False, is_last=False)
    self.assertEqual((one.gradient_bytes, one.kept_bytes),
                     (0, (1 + 40) * MIB))


class StepTimeTest(parameterized.TestCase):

  def testOneDevice(self):
    self.assertEqual(step_model.StepSeconds([0.5], [1.25], 4), 7.0)
    self.assertEqual(
        step_model.StepSeconds([0.5], [1.25], 4, schedule_name='1f1b'), 7.0)

  def testTwoDevicesTwoMicroBatches(self):
    # The module docstring's tables.
    times = step_model.TaskTimes([1, 2], [3, 4], 2)
    self.assertEqual(times, {
        ('F', 0, 0): (0, 1), ('F', 0, 1): (1, 2),
        ('F', 1, 0): (1, 3), ('F', 1, 1): (3, 5),
        ('B', 1, 1): (5, 9), ('B', 1, 0): (9, 13),
        ('B', 0, 1): (9, 12), ('B', 0, 0): (13, 16)})
    self.assertEqual(step_model.StepSeconds([1, 2], [3, 4], 2), 16)
    times = step_model.TaskTimes([1, 2], [3, 4], 2, schedule_name='1f1b')
    self.assertEqual(times, {
        ('F', 0, 0): (0, 1), ('F', 0, 1): (1, 2),
        ('F', 1, 0): (1, 3), ('B', 1, 0): (3, 7),
        ('F', 1, 1): (7, 9), ('B', 1, 1): (9, 13),
        ('B', 0, 0): (7, 10), ('B', 0, 1): (13, 16)})

  # K=2 M=4, F = (1, 2), B = (3, 4), by hand: each action at the later of
  # its device's previous end and the ends of what it reads (B(1, m) reads
  # F(1, m) only: its loss is made as that forward ends).
  #   gpipe  dev 0: F0-F3 0-4; B3 13-16 B2 17-20 B1 21-24 B0 25-28
  #          dev 1: F0 1-3 F1 3-5 F2 5-7 F3 7-9 B3 9-13 B2 13-17 B1 17-21
  #                 B0 21-25
  #   1f1b   dev 0: F0 0-1 F1 1-2 B0 7-10 F2 10-11 B1 13-16 F3 16-17
  #                 B2 19-22 B3 25-28
  #          dev 1: F0 1-3 B0 3-7 F1 7-9 B1 9-13 F2 13-15 B2 15-19
  #                 F3 19-21 B3 21-25
  @parameterized.parameters(
      ('gpipe', {('F', 0, 0): (0, 1), ('F', 0, 1): (1, 2),
                 ('F', 0, 2): (2, 3), ('F', 0, 3): (3, 4),
                 ('B', 0, 3): (13, 16), ('B', 0, 2): (17, 20),
                 ('B', 0, 1): (21, 24), ('B', 0, 0): (25, 28),
                 ('F', 1, 0): (1, 3), ('F', 1, 1): (3, 5),
                 ('F', 1, 2): (5, 7), ('F', 1, 3): (7, 9),
                 ('B', 1, 3): (9, 13), ('B', 1, 2): (13, 17),
                 ('B', 1, 1): (17, 21), ('B', 1, 0): (21, 25)}),
      ('1f1b', {('F', 0, 0): (0, 1), ('F', 0, 1): (1, 2),
                ('B', 0, 0): (7, 10), ('F', 0, 2): (10, 11),
                ('B', 0, 1): (13, 16), ('F', 0, 3): (16, 17),
                ('B', 0, 2): (19, 22), ('B', 0, 3): (25, 28),
                ('F', 1, 0): (1, 3), ('B', 1, 0): (3, 7),
                ('F', 1, 1): (7, 9), ('B', 1, 1): (9, 13),
                ('F', 1, 2): (13, 15), ('B', 1, 2): (15, 19),
                ('F', 1, 3): (19, 21), ('B', 1, 3): (21, 25)}))
  def testEachScheduleByHand(self, name, expected):
    times = step_model.TaskTimes([1, 2], [3, 4], 4, schedule_name=name)
    self.assertEqual(times, expected)
    self.assertEqual(
        step_model.StepSeconds([1, 2], [3, 4], 4, schedule_name=name), 28)
    # Device 0 works 4 x (1 + 3), device 1 4 x (2 + 4) of 2 x 28.
    self.assertAlmostEqual(
        step_model.IdleFraction([1, 2], [3, 4], 4, schedule_name=name),
        1 - (16 + 24) / 56, places=12)

  def testInterleavedByHand(self):
    # K=2 V=2 M=2, unit forwards, backwards 2: stages 0, 2 on device 0.
    #   dev 0: F0.0 0-1 F0.1 1-2 F2.0 2-3 F2.1 3-4 B2.0 6-8 B2.1 9-11
    #          B0.0 11-13 B0.1 13-15
    #   dev 1: F1.0 1-2 F1.1 2-3 F3.0 3-4 B3.0 4-6 F3.1 6-7 B3.1 7-9
    #          B1.0 9-11 B1.1 11-13
    times = step_model.TaskTimes([1] * 4, [2] * 4, 2,
                                 schedule_name='interleaved_1f1b',
                                 num_virtual_stages=2)
    self.assertEqual(times, {
        ('F', 0, 0): (0, 1), ('F', 0, 1): (1, 2), ('F', 2, 0): (2, 3),
        ('F', 2, 1): (3, 4), ('B', 2, 0): (6, 8), ('B', 2, 1): (9, 11),
        ('B', 0, 0): (11, 13), ('B', 0, 1): (13, 15),
        ('F', 1, 0): (1, 2), ('F', 1, 1): (2, 3), ('F', 3, 0): (3, 4),
        ('B', 3, 0): (4, 6), ('F', 3, 1): (6, 7), ('B', 3, 1): (7, 9),
        ('B', 1, 0): (9, 11), ('B', 1, 1): (11, 13)})
    with self.assertRaisesRegex(ValueError, r"^Schedule 'gpipe': "
                                r'num_virtual_stages=2 must be a positive '
                                r'divisor of the 3 cells'):
      step_model.StepSeconds([1] * 3, [2] * 3, 2, num_virtual_stages=2)

  def testFillAndDrain(self):
    # Equal stages: (M + K - 1) ticks each way, GPipe and 1F1B alike.
    for name in ('gpipe', '1f1b'):
      self.assertEqual(
          step_model.StepSeconds([1] * 3, [2] * 3, 4, schedule_name=name),
          (4 + 3 - 1) * (1 + 2))
      # Idle share of equal stages is (K-1)/(M+K-1).
      self.assertAlmostEqual(
          step_model.IdleFraction([1] * 3, [2] * 3, 4, schedule_name=name),
          2 / 6, places=12)

  def testOverheadPerTask(self):
    self.assertEqual(step_model.StepSeconds([1], [2], 2, overhead_s=0.5),
                     2 * (1 + 2) + 4 * 0.5)

  def testHopsDelayEveryCrossing(self):
    # The module docstring's second table: each dependency across the
    # boundary waits 0.5, forward and backward.
    times = step_model.TaskTimes([1, 2], [3, 4], 2, hop_s=[0.5])
    self.assertEqual(times, {
        ('F', 0, 0): (0, 1), ('F', 0, 1): (1, 2),
        ('F', 1, 0): (1.5, 3.5), ('F', 1, 1): (3.5, 5.5),
        ('B', 1, 1): (5.5, 9.5), ('B', 1, 0): (9.5, 13.5),
        ('B', 0, 1): (10, 13), ('B', 0, 0): (14, 17)})
    self.assertEqual(step_model.StepSeconds([1, 2], [3, 4], 2, hop_s=[0.5]),
                     17)
    # At M=1 every task is on the critical path: both hops add up.
    self.assertEqual(
        step_model.StepSeconds([1, 2, 1], [3, 4, 3], 1, hop_s=[0.25, 0.5]),
        1 + 2 + 1 + 3 + 4 + 3 + 2 * (0.25 + 0.5))
    self.assertEqual(step_model.StepSeconds([1, 2], [3, 4], 2, hop_s=[0]),
                     step_model.StepSeconds([1, 2], [3, 4], 2))

  def testOneHopPerBoundary(self):
    with self.assertRaisesRegex(ValueError, 'give one per boundary, 1'):
      step_model.StepSeconds([1, 2], [3, 4], 2, hop_s=[0.5, 0.5])


def _Flat(n, residual=3):
  """n one-layer stages: 1 MiB in and out, `residual` MiB kept, no
  parameters: in = out = 1, R = 3 (kept), W = 4 (3 on the last stage,
  whose output gradient is among its micro-batches in flight)."""
  return [_Profile(i, 1, 1, 1, 0, residual=residual) for i in range(n)]


class HoldingTest(parameterized.TestCase):

  def testOneFOneBCountsFromItsTable(self):
    table = registry.Make('1f1b', 2, 4)
    # Stage 0's inputs are slices of the batch, all 4 through the step;
    # at most 2 in flight. Stage 1 holds one micro-batch in flight, and
    # during each backward the next input too: it arrives while that
    # backward runs. None waits for a W; the running sum exists after
    # each stage's first backward (device 0's third action, device 1's
    # second).
    self.assertEqual(step_model.Holding(table), [
        [{0: c} for c in [(4, 1, 0, 0), (4, 2, 0, 0), (4, 2, 0, 0),
                          (4, 2, 0, 1), (4, 2, 0, 1), (4, 2, 0, 1),
                          (4, 2, 0, 1), (4, 1, 0, 1)]],
        [{1: c} for c in [(1, 1, 0, 0), (2, 1, 0, 0), (1, 1, 0, 1),
                          (2, 1, 0, 1), (1, 1, 0, 1), (2, 1, 0, 1),
                          (1, 1, 0, 1), (1, 1, 0, 1)]]])

  @parameterized.parameters(('gpipe', 1), ('1f1b', 1), ('zb_h1', 1),
                            ('interleaved_1f1b', 2), ('gpipe', 2))
  def testInFlightIsTheTables(self, name, v):
    for k, m in ((1, 1), (2, 2), (2, 4), (3, 6), (4, 8), (4, 2)):
      if name == 'interleaved_1f1b' and m % k:
        continue
      table = registry.Make(name, k, m, v)
      states = step_model.StageStates(table)
      self.assertEqual(
          tuple(max(x[1] + x[2] for x in stage) for stage in states),
          schedule.InFlight(table)[0], (k, m))

  @parameterized.parameters(
      # recompute 'never': each micro-batch in flight keeps R = 3 MiB,
      # + its output gradient (1 MiB) on the last stage; its input besides.
      #   gpipe: M = 8 inputs, 8 in flight: 8 + 8 x 3 + (W - R = 1)
      #          = 33; last 8 + 8 x (3 + 1) + 0 = 40
      #   1f1b: stage k holds K - k in flight and, k > 0, one input more;
      #          stage 0 the batch's 8 inputs (slices of it):
      #          8 + 4 x 3 + 1, 4 + 3 x 3 + 1, 3 + 2 x 3 + 1, 2 + 1 x 4
      ('never', 'gpipe', [33, 33, 33, 40]), ('never', '1f1b', [21, 14, 10, 6]),
      # 'always': the inputs, the backward's W = 4 (3 on the last), and
      # the last stage's output gradients.
      ('always', 'gpipe', [12, 12, 12, 19]),
      ('always', '1f1b', [12, 8, 7, 6]))
  def testStageKHoldsWhatTheTableSays(self, recompute, name, mib):
    parts = step_model.Predict(_Flat(4), [0, 1, 2, 3, 4], 8, recompute, name)
    self.assertEqual([p.kept_bytes for p in parts], [x * MIB for x in mib])
    self.assertEqual([p.step_bytes for p in parts], [x * MIB for x in mib])

  def testADeviceHoldsItsStagesAtOnce(self):
    # K=1, V=2, GPipe, M=2, 'always'. Device 0 runs
    #   F0.0 F0.1 F1.0 F1.1 B1.1 B1.0 B0.1 B0.0
    # and holds (stage 0: the batch's 2 inputs + W 4 in its backwards;
    # stage 1: inputs x 1 + in flight x 1 (output gradients) + W 3 in its
    # own)
    #   2, 2 + 1, 2 + 2 + 1, 2 + 2 + 2, 2 + (2 + 2 + 3), 2 + (1 + 1 + 3),
    #   2 + 4, 2 + 4: at most 9 MiB, less than its stages' own peaks
    #   (6 and 7 MiB) added up.
    parts = step_model.Predict(_Flat(2), [0, 1, 2], 2, 'always', 'gpipe', 2)
    self.assertEqual([p.kept_bytes for p in parts], [6 * MIB, 7 * MIB])
    dev, = step_model.PredictDevices(parts, registry.Make('gpipe', 1, 2, 2))
    self.assertEqual((dev.stages, dev.kept_bytes), ((0, 1), 9 * MIB))


class TransferTest(absltest.TestCase):

  def testHopsOfAPrediction(self):
    profiles = [_Profile(i, 0.5, 1.0, act=i + 1, params=1)
                for i in range(4)]
    cost = transfer_profile.TransferCost(latency_s=0.01,
                                         seconds_per_byte=1e-3 / MIB,
                                         measured=True)
    result = plan_search.Evaluate('x', profiles, 8, 2, 2, transfer=cost)
    b = result.bounds[1]
    hop = 0.01 + 1e-3 * b  # layer b - 1 outputs b MiB
    self.assertEqual(result.hop_s, [cost.Seconds(b * MIB)])
    self.assertAlmostEqual(result.hop_s[0], hop, places=12)
    fwd = [p.forward_s for p in result.partitions]
    bwd = [p.backward_s for p in result.partitions]
    self.assertEqual(result.step_s,
                     step_model.StepSeconds(fwd, bwd, 2, hop_s=[hop]))
    self.assertGreater(result.step_s, step_model.StepSeconds(fwd, bwd, 2))
    self.assertIn(f'0->1 {hop * 1e3:.2f} ms', str(result))
    # One partition hands nothing on.
    self.assertEqual(plan_search.Evaluate('x', profiles, 8, 1, 2,
                                   transfer=cost).hop_s, [])
    # Nothing measured (one device here): free, and the report says so.
    free = plan_search.Evaluate('x', profiles, 8, 2, 2)
    self.assertEqual(free.hop_s, [0.0])
    self.assertEqual(free.step_s, step_model.StepSeconds(fwd, bwd, 2))
    self.assertIn('Hand-offs between partitions counted as free', str(free))

  def testReplicasAllReduceEachStageAfterItsLastBackward(self):
    profiles = [_Profile(i, 0.5, 1.0, act=1, params=4) for i in range(4)]
    cost = transfer_profile.TransferCost(latency_s=0.0,
                                         seconds_per_byte=0.1 / MIB,
                                         measured=True)
    two = plan_search.Exchange(2, cost)
    for k in (1, 2):
      alone = plan_search.Evaluate('x', profiles, 8, k, 4)
      summed = plan_search.Evaluate('x', profiles, 8, k, 4, exchange=two)
      self.assertEqual(summed.bounds, alone.bounds)
      stage_bytes = [4 * MIB * (b - a)
                     for a, b in zip(summed.bounds, summed.bounds[1:])]
      self.assertEqual(summed.all_reduce_s,
                       [two.Seconds(b) for b in stage_bytes])
      self.assertEqual(alone.all_reduce_s, [])
      table = schedule.WithAllReduce(registry.Make('gpipe', k, 4))
      sim = schedule.Simulate(
          table, [p.forward_s for p in summed.partitions],
          [p.backward_s for p in summed.partitions],
          all_reduce_s=summed.all_reduce_s)
      self.assertEqual(summed.step_s, sim.step)
      self.assertIn('All-reduce over the 2 copies', str(summed))
      self.assertIn('per replica of 2', str(summed))
    # K=1: the sum comes after the only backward, all of it in the step.
    one = plan_search.Evaluate('x', profiles, 8, 1, 4)
    self.assertAlmostEqual(
        plan_search.Evaluate('x', profiles, 8, 1, 4, exchange=two).step_s,
        one.step_s + two.Seconds(16 * MIB), places=12)
    # K=2: the last stage's sum runs while stage 0 is still in backward.
    two_k = plan_search.Evaluate('x', profiles, 8, 2, 4, exchange=two)
    base = plan_search.Evaluate('x', profiles, 8, 2, 4)
    self.assertLess(two_k.step_s,
                    base.step_s + sum(two_k.all_reduce_s) - 1e-9)
    # Not measured (one device): free, and the report says so.
    self.assertEqual(plan.MeasureAllReduce(1).between, 'one replica')
    self.assertIn('All-reduce over the 2 copies counted as free', str(
        plan_search.Evaluate('x', profiles, 8, 1, 4,
                             exchange=plan_search.Exchange(
                                 2, transfer_profile.TransferCost(
                                     between='one device')))))

class SuggestTest(absltest.TestCase):

  def _ByM(self):
    """Four equal layers; a smaller micro-batch keeps less per micro-batch.

    Step times (F=1/8 s, B=2/8 s per layer per micro-batch of M=1, scaled
    by 1/M; recompute adds F): the fastest is K=2 at M=4.
    """
    out = {}
    for m in (1, 2, 4):
      out[m] = [_Profile(i, 1 / 8 / m, 2 / 8 / m, 16 // m, 1,
                         residual=64 // m) for i in range(4)]
    return out

  def testSuggestionChangesWithBudget(self):
    by_m = self._ByM()
    free = plan_search.Suggest('toy', by_m, 8, [1, 2])
    self.assertEqual((free.num_partitions, free.num_micro_batches), (2, 4))
    self.assertIn("the fastest step by its layers' sums", free.why)
    tight_budget = budget_split.LeastPeak(by_m[4], 2, 4) - 1
    tight = plan_search.Suggest('toy', by_m, 8, [1, 2, 3, 4],
                                budget=tight_budget)
    self.assertGreater(tight.num_partitions, 2)
    for part in tight.partitions:
      self.assertLessEqual(part.peak_bytes, tight_budget)

  def testNothingFits(self):
    with self.assertRaisesRegex(ValueError, r'^memory_budget=1\.00 KiB fits '
                                r'no K .* raise --memory_budget[^\n]*$'):
      plan_search.Suggest('toy', self._ByM(), 8, [1, 2], budget=1024)


  def testPicksOneFOneBWhenGPipeDoesNotFitAndTimesTie(self):
    # Equal stages: GPipe's and 1F1B's steps are the same (the same
    # bubble); 1F1B's stage 0 holds K = 2 micro-batches, GPipe's all 4.
    by_m = {4: self._ByM()[4]}
    both = [plan_search.Layout('gpipe'), plan_search.Layout('1f1b')]
    plans = {layout.schedule_name: plan_search.Evaluate(
        'toy', by_m[4], 8, 2, 4, layout=layout) for layout in both}
    self.assertEqual(plans['gpipe'].step_s, plans['1f1b'].step_s)
    self.assertLess(plans['1f1b'].peak_bytes, plans['gpipe'].peak_bytes)
    budget = plans['gpipe'].peak_bytes - 1
    self.assertEqual(budget_split.LeastPeak(by_m[4], 2, 4), budget + 1)
    chosen = plan_search.Suggest('toy', by_m, 8, [2], budget=budget,
                                 layouts=both)
    self.assertEqual(chosen.layout, plan_search.Layout('1f1b'))
    self.assertEqual(chosen.bounds, plans['1f1b'].bounds)
    self.assertEqual(chosen.why, '')  # K and M were given
    self.assertEqual(chosen.why_schedule, '1f1b at K=2 M=4: gpipe does not '
                     'fit the budget there.')
    self.assertIn('Schedule: 1f1b at K=2 M=4: gpipe does not fit',
                  str(chosen))
    # No budget: a tie in time goes to the one holding less.
    free = plan_search.Suggest('toy', by_m, 8, [2], layouts=both)
    self.assertEqual(free.layout, plan_search.Layout('1f1b'))
    self.assertRegex(free.why_schedule, r'^1f1b at K=2 M=4: as fast as '
                     r'gpipe within 2% \(\S+ against \S+ s\), holding '
                     r'\S+ MiB per device, \S+ MiB less than its \S+ '
                     r'MiB\.$')
    # GPipe alone does not fit at all.
    with self.assertRaisesRegex(ValueError, r'^memory_budget=\S+ MiB is too '
                                r'small for K=2 M=4 gpipe: its best split '
                                r'needs'):
      plan_search.Suggest('toy', by_m, 8, [2], budget=budget)

  def testOneFOneBFitsFewerDevices(self):
    # On one device 1F1B holds one micro-batch where GPipe holds all M:
    # under this budget only 1F1B runs on one device.
    by_m = self._ByM()
    budget = budget_split.LeastPeak(by_m[4], 1, 4,
                                    layout=plan_search.Layout('1f1b'))
    self.assertLess(budget, min(budget_split.LeastPeak(by_m[m], 1, m)
                                for m in by_m))
    both = [plan_search.Layout('gpipe'), plan_search.Layout('1f1b')]
    chosen = plan_search.Suggest('toy', by_m, 8, [1], budget=budget,
                                 layouts=both)
    self.assertEqual((chosen.num_devices, chosen.num_micro_batches,
                      chosen.layout.schedule_name), (1, 4, '1f1b'))
    self.assertIn('K=1 M=4: the fastest step that fits', chosen.why)
    with self.assertRaisesRegex(ValueError, r'fits no K in \[1\]'):
      plan_search.Suggest('toy', by_m, 8, [1], budget=budget)

  def testOneProfileInAnotherSchedule(self):
    profiles = self._ByM()[4]
    gpipe = plan_search.Evaluate('toy', profiles, 8, 2, 4)
    one_f = plan_search.Evaluate('toy', profiles, 8, 2, 4,
                                 layout=plan_search.Layout('1f1b'))
    moved = plan_search.InLayout(gpipe, plan_search.Layout('1f1b'))
    self.assertEqual(moved.bounds, one_f.bounds)
    self.assertEqual(moved.partitions, one_f.partitions)
    self.assertEqual((moved.step_s, moved.devices),
                     (one_f.step_s, one_f.devices))

  def testInterleavedDevicesAddUpTheirStages(self):
    # K=1, V=2: each stage fits the budget, the device holding both does
    # not.
    layout = plan_search.Layout('interleaved_1f1b', 2)
    free = plan_search.Evaluate('toy', _Flat(4), 8, 1, 2, layout=layout)
    stage_most = max(p.peak_bytes for p in free.partitions)
    self.assertGreater(free.peak_bytes, stage_most)
    with self.assertRaisesRegex(
        ValueError, r'^memory_budget=\S+ MiB is too small for K=1 M=2 '
        r'interleaved_1f1b V=2: device 0 holds its stages \[0, 1\] at '
        r'once, \S+ MiB; raise --memory_budget to \S+ MiB or use more '
        r'devices\.$'):
      plan_search.Evaluate('toy', _Flat(4), 8, 1, 2, budget=stage_most,
                           layout=layout)
    text = str(free)
    self.assertIn('K=1 devices x V=2 stages, M=2 micro-batches', text)
    self.assertRegex(text, r'device 0 \(stages 0, 1\): busy \S+ s of the '
                     'step, peak')


class _NoPipeline:
  """A registered model without a PipeliningLayer."""

  def Task(self):
    p = hyperparams.Params()
    p.Define('name', '', 'The name.')
    p.Define('network', hyperparams.Params(), 'Not a pipeline.')
    return p

  def Train(self):
    return None


model_registry.RegisterSingleTaskModel(_NoPipeline)
_NO_PIPELINE = model_registry._Key(_NoPipeline)  # pylint: disable=protected-access


class ErrorsTest(absltest.TestCase):

  def testUnknownModel(self):
    with self.assertRaisesRegex(LookupError, "^Unknown model 'image.synth"
                                r"etic.AmoebaNetTiny'; did you mean"):
      plan.Main(['--model=image.synthetic.AmoebaNetTiny'])

  def testNoPipeline(self):
    with self.assertRaisesRegex(ValueError, r'has no PipeliningLayer in '
                                r'its task params; put its network in one'):
      model_pipeline.FromRegistry(_NO_PIPELINE)

  def testTooManyPartitions(self):
    profiles = _RandomProfiles(random.Random(1), 3)
    with self.assertRaisesRegex(ValueError, r'^num_partitions=4 but the '
                                r'pipeline has 3 layers; use between 1 and '
                                r'3\.$'):
      plan_search.Evaluate('toy', profiles, 8, 4, 1)

  def testBudgetTooSmall(self):
    profiles = [_Profile(i, 1 / 8, 1 / 8, 1, 0, residual=8)
                for i in range(4)]
    need = budget_split.LeastPeak(profiles, 1, 1)
    with self.assertRaisesRegex(
        ValueError, r'^memory_budget=\S+ MiB is too small for K=1 M=1 '
        r'gpipe: its best split needs \S+ MiB on one device; raise '
        r'--memory_budget to \S+ MiB or use K=2 partitions\.$'):
      plan_search.Evaluate('toy', profiles, 8, 1, 1, budget=need - 1)

  def testBadCoresText(self):
    with self.assertRaisesRegex(ValueError, r'^--cores=0;1: give core '
                                r'numbers separated by commas, e\.g\. '
                                r'--cores=0,1\.$'):
      plan.Main(['--model=image.synthetic.ResNetTinyGPipe', '--cores=0;1'])
    with self.assertRaisesRegex(ValueError, r'^--num_partitions=3 but '
                                r'--cores=0,1 gives 2: give one core per '
                                r'partition\.$'):
      plan.Main(['--model=image.synthetic.ResNetTinyGPipe', '--cores=0,1',
                 '--num_partitions=3'])

  def testBadScheduleFlags(self):
    model = '--model=image.synthetic.ResNetTinyGPipe'
    with self.assertRaisesRegex(ValueError, r'^--schedule=interleaved_1f1b: '
                                r"Schedule 'interleaved_1f1b' runs 2 or more "
                                r'stages per device, got '
                                r'num_virtual_stages=1; set '
                                r'num_virtual_stages >= 2 '):
      plan.Main([model, '--schedule=interleaved_1f1b'])
    with self.assertRaisesRegex(ValueError, r"^--schedule=1f1b: Schedule "
                                r"'1f1b' runs one stage per device, got "
                                r'num_virtual_stages=2; set '
                                r'num_virtual_stages=1 '):
      plan.Main([model, '--schedule=1f1b', '--num_virtual_stages=2'])
    with self.assertRaisesRegex(ValueError, r"^Schedule 'interleaved_1f1b' "
                                r'needs M a multiple of K: M=3, K=2; set '
                                r'num_micro_batches to 2 or 4\.$'):
      plan_search.Evaluate('toy', _Flat(4), 6, 2, 3,
                           layout=plan_search.Layout('interleaved_1f1b', 2))
    with self.assertRaisesRegex(ValueError, r"^Unknown schedule 'pipedream'; "
                                r"use one of \('gpipe', .*\) or a table's "
                                r'\.csv file\.$'):
      plan.Main([model, '--schedule=pipedream'])

  def testBadBudgetText(self):
    with self.assertRaisesRegex(ValueError, r"^memory_budget='lots' is not "
                                'a size; write e.g. 2GiB'):
      plan.ParseBytes('lots')
    self.assertEqual(plan.ParseBytes('1.5 KiB'), 1536)
    self.assertIsNone(plan.ParseBytes(''))


class InputGradientTest(absltest.TestCase):

  def testAFirstPartitionThatKeepsActivationsMakesTheInputGradient(self):
    """The pipeline leaves the images' gradient out of partition 0 only
    when it re-computes; Refine measures it the same way."""
    pipe = model_pipeline.FromRegistry('image.synthetic.ResNetTinyGPipe')
    profiles = plan.ProfileAt(pipe, 4, num_runs=1)
    real = layer_profile._GradientFn  # pylint: disable=protected-access
    free = transfer_profile.TransferCost()
    for recompute, first in (('always', False), ('never', True),
                             ('except_last', False)):
      seen = []

      def Spy(layer, args, out, input_gradient=True, seen=seen):
        seen.append(input_gradient)
        return real(layer, args, out, input_gradient)

      first_plan = plan_search.Evaluate(pipe.name, profiles,
                                        pipe.batch_size, 2, 4, recompute)
      with mock.patch.object(layer_profile, '_GradientFn', Spy):
        plan.Refine(first_plan, pipe.layers, pipe.InputShapes(8),
                    num_runs=1, transfer=free, input_gradient=False)
      self.assertEqual(seen, [first, True], recompute)

  def testWhetherTheStepDifferentiatesThePipelineInput(self):
    # Images need no gradient; an MT stack's embedded input does.
    self.assertFalse(model_pipeline.FromRegistry(
        'image.synthetic.ResNetTinyGPipe').input_gradient)
    self.assertTrue(model_pipeline.FromRegistry(
        'mt.synthetic.TransformerTinyGPipe').input_gradient)


class CommandLineTest(absltest.TestCase):

  def testPlansARegisteredModel(self):
    pipe = model_pipeline.FromRegistry('image.synthetic.ResNetTinyGPipe')
    report = plan.Main(['--model=image.synthetic.ResNetTinyGPipe',
                        '--num_partitions=2', '--num_micro_batches=4',
                        '--schedule=1f1b', '--num_timing_runs=1'])
    lines = report.splitlines()
    self.assertRegex(lines[0], r"^Plan for 'image.synthetic.ResNetTinyGPipe'"
                     ': K=2 partitions, M=4 micro-batches of 8 \\(batch 32\\), '
                     'schedule 1f1b, recompute=')
    # Given, not suggested: no line says why.
    self.assertNotIn('Schedule:', report)
    self.assertIn('the 1f1b table run with these costs', report)
    self.assertRegex(report, r'Predicted step: \d+\.\d+ s')
    self.assertIn('Pipeline balance by time: K=2 partitions, M=4', report)
    # Both cells' layers together are the model's layers, in order.
    names = [p.name for p in pipe.layers]
    rows = [line.split() for line in lines if line.startswith('  0 ') or
            line.startswith('  1 ')]
    self.assertLen(rows, 4)  # the predictions and the balance report
    self.assertEqual(rows[2][1], names[0])
    self.assertEqual(rows[3][3], names[-1])
    # The report says what its memory figures lack exactly when this
    # process's allocator keeps no statistics: a CPU's default one keeps
    # none unless TF_CPU_ALLOCATOR_USE_BFC=true, or where TensorFlow uses
    # oneDNN's allocator (seen on an AVX-512 AMD EPYC).
    if layer_profile.AllocatorDevice() is None:
      self.assertIn('traced gradient only', report)
    else:
      self.assertNotIn('traced gradient only', report)

  def testPlansEachReplicaAndItsAllReduce(self):
    report = plan.Main([
        '--model=image.synthetic.ResNetTinyGPipe', '--num_partitions=1',
        '--num_micro_batches=2', '--schedule=gpipe', '--num_timing_runs=1',
        '--model_params_override=task.train.num_replicas : 2'])
    # Each replica: half the batch of 32; the exchange measured here
    # between two logical CPUs.
    self.assertIn('M=2 micro-batches of 8 (batch 16)', report)
    self.assertIn('per replica of 2', report)
    self.assertRegex(report, r"All-reduce over the 2 copies after each "
                     r"stage's last backward: stage 0 [\d.]+ ms; measured "
                     r'[\d.]+ ms \+ [\d.]+ ms/MiB \(all-reduce over '
                     r'/device:CPU:0 and /device:CPU:1\)')
    # Two devices for two replicas: each replica's pipeline gets one.
    suggested = plan.Main([
        '--model=image.synthetic.ResNetTinyGPipe', '--num_devices=2',
        '--num_micro_batches=2', '--schedule=gpipe', '--num_timing_runs=1',
        '--model_params_override=task.train.num_replicas : 2'])
    self.assertIn(': K=1 partitions, M=2', suggested.splitlines()[0])

  def testRefinedPartitionsAreTheirLayersMeasuredWhole(self):
    pipe = model_pipeline.FromRegistry('image.synthetic.ResNetTinyGPipe')
    profiles = plan.ProfileAt(pipe, 4, num_runs=1)
    first = plan_search.Evaluate(pipe.name, profiles, pipe.batch_size, 2, 4)
    result = plan.Refine(first, pipe.layers, pipe.InputShapes(8),
                         num_runs=1)
    self.assertEqual(result.bounds, first.bounds)
    parts = result.partition_profiles
    self.assertEqual([p.name for p in parts], ['partition_0', 'partition_1'])
    for part, (a, b) in zip(parts, zip(result.bounds, result.bounds[1:])):
      self.assertEqual(part.num_params,
                       sum(p.num_params for p in profiles[a:b]))
      self.assertEqual(part.input_bytes, profiles[a].input_bytes)
      self.assertEqual(part.output_bytes, profiles[b - 1].output_bytes)
    # The printed prediction is the partitions', with the hand-off of
    # partition 0's output measured between this process's first two
    # (logical) devices.
    self.assertEqual(result.partitions,
                     step_model.Predict(parts, [0, 1, 2], 4))
    self.assertIn(' -> ', result.transfer.between)
    self.assertEqual(result.hop_s,
                     [result.transfer.Seconds(parts[0].output_bytes)])
    self.assertEqual(result.step_s, step_model.StepSeconds(
        [p.forward_s for p in result.partitions],
        [p.backward_s for p in result.partitions], 4, hop_s=result.hop_s))
    self.assertIn('each partition measured whole', str(result))
    self.assertNotIn('exceed the budget', str(result))
    tight = dataclasses.replace(
        result, budget=min(p.peak_bytes for p in result.partitions) - 1)
    self.assertIn('partitions [0, 1] measured whole exceed the budget',
                  str(tight))

  def testTheCommandMeasuresWorkingSetsAndPartitionsTogether(self):
    """`python -m lingvo_pipe.tools.plan` turns the allocator's statistics
    on before TensorFlow starts, so every layer's backward is measured;
    with --cores each partition is measured in its own pinned process,
    all at once, and the children inherit the statistics. One command
    checks both (each start costs the suite): it needs two cores."""
    cores = sorted(os.sched_getaffinity(0))[:2]
    if len(cores) < 2:
      self.skipTest('plan --cores measures partitions on two cores; this '
                    'process may use one')
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
    env.pop('TF_CPU_ALLOCATOR_USE_BFC', None)
    # Pinned to the first core, as the README runs it for workers.
    out = subprocess.run(
        ['taskset', '-c', str(cores[0])] +
        [sys.executable, '-m', 'lingvo_pipe.tools.plan',
         '--model=image.synthetic.ResNetTinyGPipe', '--num_partitions=2',
         '--num_micro_batches=4', '--num_timing_runs=1',
         f'--cores={cores[0]},{cores[1]}'],
        env=env, capture_output=True, text=True, timeout=300)
    self.assertEqual(out.returncode, 0, out.stderr[-2000:])
    self.assertIn('Predicted step:', out.stdout)
    # No --schedule: GPipe, 1F1B and 1F1B ahead compared at K and M.
    self.assertRegex(out.stdout,
                     r'\nSchedule: (gpipe|1f1b|1f1b_ahead) at K=2 M=4: ')
    self.assertNotIn('traced gradient only', out.stdout)
    self.assertIn(f'each partition measured whole, all at once on cores '
                  f'{cores}', out.stdout)
    # The hand-off was measured between two worker servers on those
    # cores: moving bytes through gRPC is not free.
    match = re.search(r'Hand-offs per micro-batch, each way: 0->1 '
                      r'([\d.]+) ms; transfer ([\d.]+) ms \+ ([\d.]+) '
                      r'ms/MiB, taking (\d+)% of it from the sender and '
                      r'(\d+)% from the receiver \(worker servers on cores '
                      f'{cores[0]} and {cores[1]}\\)', out.stdout)
    self.assertIsNotNone(match, out.stdout)
    self.assertGreater(float(match.group(3)), 0.0)
    # Worker processes copy the bytes on their own cores.
    self.assertGreater(int(match.group(4)) + int(match.group(5)), 0)


if __name__ == '__main__':
  absltest.main()
