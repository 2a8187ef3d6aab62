"""Tests of lingvo_pipe.core.schedule: tables, validator and simulator.

The expected tables are written by hand from each schedule's definition,
as 'F<stage>.<micro-batch>' per action, one string per device.
"""

from absl.testing import absltest
from absl.testing import parameterized

from lingvo_pipe.core import schedule
from lingvo_pipe.core.schedules import registry

A = schedule.Action


def _Row(text):
  """'F0.1 B0.0' -> (Action('F', 0, 1), Action('B', 0, 0))."""
  out = []
  for word in text.split():
    stage, micro_batch = word[1:].split('.')
    out.append(A(word[0], int(stage), int(micro_batch)))
  return tuple(out)


def _Rows(*texts):
  return tuple(_Row(t) for t in texts)


def _Table(num_micro_batches, stage_devices, *texts):
  return schedule.Schedule('hand', num_micro_batches, tuple(stage_devices),
                           _Rows(*texts))


def _Cases(names=('gpipe', '1f1b', 'interleaved_1f1b')):
  """(name, K, M, V) over K 1-5, M 1-12; V 1-3 for GPipe, 2-4 interleaved."""
  for k in range(1, 6):
    for m in range(1, 13):
      if 'gpipe' in names:
        for v in (1, 2, 3):
          yield 'gpipe', k, m, v
      if '1f1b' in names:
        yield '1f1b', k, m, 1
      if 'interleaved_1f1b' in names and m % k == 0:
        for v in (2, 3, 4):
          yield 'interleaved_1f1b', k, m, v


def _Leading(name, k, d, m, v):
  """Forwards device d runs before its first backward, by definition.

  1F1B and interleaved: the warm-up, then the first forward of the steady
  state, if any. Also the most micro-batches the device holds at once.
  """
  if name == 'gpipe':
    return m * v
  if name == '1f1b':
    return min(k - d, m)
  return min(2 * (k - 1 - d) + (v - 1) * k + 1, m * v)


class GeneratorTest(parameterized.TestCase):

  @parameterized.named_parameters(
      # ZB-V (schedules/zb_v.py): stages d and 2K-1-d on device d; the
      # same table as torch.distributed.pipelining's ScheduleZBVZeroBubble
      # writes for K=2, M=4 (schedule_file_test loads its CSV).
      ('ZeroBubbleVK2M4', lambda: registry.Make('zb_v', 2, 4, 2),
       (0, 1, 1, 0), (
           'F0.0 F0.1 F0.2 F3.0 B3.0 W3.0 F3.1 B3.1 W3.1 F0.3 B0.0 W0.0 '
           'F3.2 B3.2 W3.2 B0.1 W0.1 F3.3 B3.3 W3.3 B0.2 W0.2 B0.3 W0.3',
           'F1.0 F2.0 F1.1 F2.1 B2.0 W2.0 F1.2 B1.0 W1.0 F2.2 B2.1 W2.1 '
           'F1.3 B1.1 W1.1 F2.3 B2.2 W2.2 B1.2 B2.3 B1.3 W1.2 W2.3 W1.3')),
      ('ZeroBubbleVK1M2', lambda: registry.Make('zb_v', 1, 2, 2), (0, 0), (
          'F0.0 F1.0 B1.0 W1.0 F0.1 B0.0 W0.0 F1.1 B1.1 W1.1 B0.1 W0.1',)),
      # 1F1B ahead (schedules/one_f_one_b_ahead.py): 1F1B with one more
      # warm-up forward on every device but the last.
      ('OneFOneBAheadK2M4', lambda: registry.Make('1f1b_ahead', 2, 4, 1),
       (0, 1), (
           'F0.0 F0.1 F0.2 B0.0 F0.3 B0.1 B0.2 B0.3',
           'F1.0 B1.0 F1.1 B1.1 F1.2 B1.2 F1.3 B1.3')),
      ('OneFOneBAheadK3M4', lambda: registry.Make('1f1b_ahead', 3, 4, 1),
       (0, 1, 2), (
           'F0.0 F0.1 F0.2 F0.3 B0.0 B0.1 B0.2 B0.3',
           'F1.0 F1.1 F1.2 B1.0 F1.3 B1.1 B1.2 B1.3',
           'F2.0 B2.0 F2.1 B2.1 F2.2 B2.2 F2.3 B2.3')),
      # Looped BFS (schedules/looped_bfs.py): a device's first stage for
      # every micro-batch, then its next; backwards last stage first.
      ('LoopedBFSK2V2M2', lambda: registry.Make('looped_bfs', 2, 2, 2),
       (0, 1, 0, 1), (
           'F0.0 F0.1 F2.0 F2.1 B2.1 B2.0 B0.1 B0.0',
           'F1.0 F1.1 F3.0 F3.1 B3.1 B3.0 B1.1 B1.0')),
      ('LoopedBFSK2V3M3', lambda: registry.Make('looped_bfs', 2, 3, 3),
       (0, 1, 0, 1, 0, 1), (
           'F0.0 F0.1 F0.2 F2.0 F2.1 F2.2 F4.0 F4.1 F4.2 '
           'B4.2 B4.1 B4.0 B2.2 B2.1 B2.0 B0.2 B0.1 B0.0',
           'F1.0 F1.1 F1.2 F3.0 F3.1 F3.2 F5.0 F5.1 F5.2 '
           'B5.2 B5.1 B5.0 B3.2 B3.1 B3.0 B1.2 B1.1 B1.0')),
      ('GPipeK2M3', lambda: schedule.GPipe(2, 3), (0, 1), (
          'F0.0 F0.1 F0.2 B0.2 B0.1 B0.0',
          'F1.0 F1.1 F1.2 B1.2 B1.1 B1.0')),
      ('GPipeK3M2', lambda: schedule.GPipe(3, 2), (0, 1, 2), (
          'F0.0 F0.1 B0.1 B0.0',
          'F1.0 F1.1 B1.1 B1.0',
          'F2.0 F2.1 B2.1 B2.0')),
      # V=2: stages 0, 2 on device 0 and 1, 3 on device 1; forwards by the
      # clock tick stage + micro-batch, backwards in reverse.
      ('GPipeK2M2V2', lambda: schedule.GPipe(2, 2, 2), (0, 1, 0, 1), (
          'F0.0 F0.1 F2.0 F2.1 B2.1 B2.0 B0.1 B0.0',
          'F1.0 F1.1 F3.0 F3.1 B3.1 B3.0 B1.1 B1.0')),
      # ZB-H1: 1F1B's F and B; device d lets up to d W's wait; the
      # cool-down's B's each take the oldest W; the W's left end the row.
      ('ZeroBubbleK2M4', lambda: schedule.ZeroBubbleH1(2, 4), (0, 1), (
          'F0.0 F0.1 B0.0 W0.0 F0.2 B0.1 W0.1 F0.3 B0.2 W0.2 B0.3 W0.3',
          'F1.0 B1.0 F1.1 B1.1 W1.0 F1.2 B1.2 W1.1 F1.3 B1.3 W1.2 W1.3')),
      ('ZeroBubbleK3M4', lambda: schedule.ZeroBubbleH1(3, 4), (0, 1, 2), (
          'F0.0 F0.1 F0.2 B0.0 W0.0 F0.3 B0.1 W0.1 B0.2 W0.2 B0.3 W0.3',
          'F1.0 F1.1 B1.0 F1.2 B1.1 W1.0 F1.3 B1.2 W1.1 B1.3 W1.2 W1.3',
          'F2.0 B2.0 F2.1 B2.1 F2.2 B2.2 W2.0 F2.3 B2.3 W2.1 W2.2 W2.3')),
      # Warm-up K-1-d = 2, 1, 0 forwards; then F, B in turn; then the rest.
      ('OneFOneBK3M4', lambda: schedule.OneFOneB(3, 4), (0, 1, 2), (
          'F0.0 F0.1 F0.2 B0.0 F0.3 B0.1 B0.2 B0.3',
          'F1.0 F1.1 B1.0 F1.2 B1.1 F1.3 B1.2 B1.3',
          'F2.0 B2.0 F2.1 B2.1 F2.2 B2.2 F2.3 B2.3')),
      # M=1: device 0's warm-up (K-1 = 1) takes the only micro-batch.
      ('OneFOneBK2M1', lambda: schedule.OneFOneB(2, 1), (0, 1), (
          'F0.0 B0.0',
          'F1.0 B1.0')),
      # M=2 < K-1 = 3: warm-up capped at M on devices 0 and 1.
      ('OneFOneBK4M2', lambda: schedule.OneFOneB(4, 2), (0, 1, 2, 3), (
          'F0.0 F0.1 B0.0 B0.1',
          'F1.0 F1.1 B1.0 B1.1',
          'F2.0 F2.1 B2.0 B2.1',
          'F3.0 B3.0 F3.1 B3.1')),
      # K=2, V=2, M=4. i-th forward: chunk (i % 4) // 2, micro-batch
      # (i // 4) * 2 + i % 2, stage chunk * 2 + d; backwards with the chunk
      # reversed. Warm-up 2(K-1-d) + (V-1)K = 4 on device 0, 2 on device 1.
      #   forwards  dev 0: F0.0 F0.1 F2.0 F2.1 F0.2 F0.3 F2.2 F2.3
      #   backwards dev 0: B2.0 B2.1 B0.0 B0.1 B2.2 B2.3 B0.2 B0.3
      ('InterleavedK2V2M4', lambda: schedule.Interleaved1F1B(2, 4, 2),
       (0, 1, 0, 1), (
           'F0.0 F0.1 F2.0 F2.1 F0.2 B2.0 F0.3 B2.1 '
           'F2.2 B0.0 F2.3 B0.1 B2.2 B2.3 B0.2 B0.3',
           'F1.0 F1.1 F3.0 B3.0 F3.1 B3.1 F1.2 B1.0 '
           'F1.3 B1.1 F3.2 B3.2 F3.3 B3.3 B1.2 B1.3')),
      # Each B followed at once by its W; 1F1B's order otherwise.
      ('OneFOneBSplitK2M3',
       lambda: registry.Make('1f1b', 2, 3, split_backward=True), (0, 1), (
           'F0.0 F0.1 B0.0 W0.0 F0.2 B0.1 W0.1 B0.2 W0.2',
           'F1.0 B1.0 W1.0 F1.1 B1.1 W1.1 F1.2 B1.2 W1.2')),
      ('GPipeSplitK2M2',
       lambda: registry.Make('gpipe', 2, 2, split_backward=True), (0, 1), (
           'F0.0 F0.1 B0.1 W0.1 B0.0 W0.0',
           'F1.0 F1.1 B1.1 W1.1 B1.0 W1.0')),
      # ZB-H1 splits already: unchanged.
      ('ZeroBubbleSplitK2M4',
       lambda: registry.Make('zb_h1', 2, 4, split_backward=True), (0, 1), (
           'F0.0 F0.1 B0.0 W0.0 F0.2 B0.1 W0.1 F0.3 B0.2 W0.2 B0.3 W0.3',
           'F1.0 B1.0 F1.1 B1.1 W1.0 F1.2 B1.2 W1.1 F1.3 B1.3 W1.2 W1.3')),
  )
  def testLiteralTable(self, make, stage_devices, rows):
    table = make()
    self.assertEqual(_Rows(*rows), table.order, msg='\n' + table.Text())
    self.assertEqual(tuple(stage_devices), table.stage_devices)
    schedule.Validate(table)

  def testMakeNamesAndValidates(self):
    for name, k, m, v in _Cases():
      with self.subTest(name=name, k=k, m=m, v=v):
        table = registry.Make(name, k, m, v)
        self.assertEqual(name, table.name)
        self.assertEqual(m, table.num_micro_batches)
        self.assertEqual(k, table.num_devices)
        self.assertEqual(tuple(s % k for s in range(k * v)),
                         table.stage_devices)
        for d, row in enumerate(table.order):
          phases = ''.join(a.phase for a in row)
          self.assertEqual(_Leading(name, k, d, m, v),
                           len(phases) - len(phases.lstrip('F')))
          if name != 'gpipe':  # then one F and one B in turn
            self.assertNotIn('FF', phases.lstrip('F'))

  def testSplitBackwardsHoldsWhatTheTableHeld(self):
    for name, k, m, v in _Cases():
      with self.subTest(name=name, k=k, m=m, v=v):
        table = registry.Make(name, k, m, v)
        split = registry.Make(name, k, m, v, split_backward=True)
        self.assertEqual(name, split.name)
        self.assertTrue(split.split_backward)
        self.assertTrue(split.split_in_place)
        self.assertFalse(table.split_in_place)
        self.assertEqual(table.order, tuple(
            tuple(a for a in row if a.phase != 'W') for row in split.order))
        for row in split.order:  # each W right after its B
          for a, b in zip(row, row[1:]):
            if a.phase == 'B':
              self.assertEqual(b, A('W', a.stage, a.micro_batch))
        self.assertEqual(schedule.InFlight(table), schedule.InFlight(split))

  def testZeroBubbleSplitsItselfNotInPlace(self):
    table = registry.Make('zb_h1', 2, 4, split_backward=True)
    self.assertTrue(table.split_backward)
    self.assertFalse(table.split_in_place)

  def testRunOrderAfterForwards(self):
    table = registry.Make('1f1b', 3, 4)
    order = schedule.RunOrder(table.Only('B'), table.Actions('F'))
    self.assertLen(order, 12)
    self.assertEqual((2, A('B', 2, 0)), order[0])
    with self.assertRaisesRegex(ValueError, r'B\(stage 0, micro-batch 0\) '
                                r'on device 0 waits for F\(stage 0'):
      schedule.RunOrder(table.Only('B'))


class ValidateTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('WrongDevice', _Table(1, (0, 1), 'F0.0 F1.0 B0.0', 'B1.0'),
       r"^Schedule 'hand': F\(stage 1, micro-batch 0\) is on device 0, but "
       r'stage 1 runs on device 1\.$'),
      ('Twice', _Table(2, (0, 1), 'F0.0 F0.1 B0.0 B0.1 B0.0',
                       'F1.0 F1.1 B1.1 B1.0'),
       r"^Schedule 'hand': B\(stage 0, micro-batch 0\) appears twice\.$"),
      ('Missing', _Table(2, (0, 1), 'F0.0 F0.1 B0.1 B0.0',
                         'F1.0 F1.1 B1.0'),
       r"^Schedule 'hand': B\(stage 1, micro-batch 1\) is missing\.$"),
      ('NotAnAction', _Table(1, (0,), 'F0.0 B0.0 F0.1'),
       r"^Schedule 'hand': device 0 lists F\(stage 0, micro-batch 1\), "
       r'which is not an action of 1 stages and 1 micro-batches\.$'),
      ('StageOffTheTable', _Table(1, (0, 2), 'F0.0 B0.0', 'F1.0 B1.0'),
       r"^Schedule 'hand': stage 1 is on device 2, but the table has "
       r'devices 0\.\.1\.$'),
      # A backward listed before its own forward.
      ('DeadlockOnOneDevice', _Table(1, (0,), 'B0.0 F0.0'),
       r"^Schedule 'hand' deadlocks: B\(stage 0, micro-batch 0\) on device "
       r'0 waits for F\(stage 0, micro-batch 0\), which device 0 never '
       r'reaches first\.$'),
      # Device 1 runs F1.1 first, which waits for F0.1, which device 0 runs
      # after B0.0, which waits for B1.0, which is after F1.1.
      ('DeadlockAcrossTwoDevices', _Table(2, (0, 1), 'F0.0 B0.0 F0.1 B0.1',
                                          'F1.1 F1.0 B1.0 B1.1'),
       r"^Schedule 'hand' deadlocks: B\(stage 0, micro-batch 0\) on device "
       r'0 waits for B\(stage 1, micro-batch 0\), which device 1 never '
       r'reaches first\.$'),
      # V=2: device 0 puts B0.0 before F2.0; B0.0 needs B1.0 <- B2.0 <-
      # F2.0, while device 1 waits in F3.0 for F2.0.
      ('DeadlockLooped', _Table(1, (0, 1, 0, 1), 'F0.0 B0.0 F2.0 B2.0',
                                'F1.0 F3.0 B3.0 B1.0'),
       r"^Schedule 'hand' deadlocks: B\(stage 0, micro-batch 0\) on device "
       r'0 waits for B\(stage 1, micro-batch 0\), which device 1 never '
       r'reaches first\.$'),
  )
  def testBadTable(self, table, regex):
    with self.assertRaisesRegex(ValueError, regex):
      schedule.Validate(table)

  @parameterized.named_parameters(
      ('Unknown', lambda: registry.Make('zero_bubble', 2, 4),
       r"^Unknown schedule 'zero_bubble'; use one of \('gpipe', '1f1b', "
       r"'interleaved_1f1b', 'zb_h1', .*\) or a table's \.csv file\.$"),
      ('ZeroBubbleV', lambda: registry.Make('zb_h1', 2, 4, 2),
       r"^Schedule 'zb_h1' runs one stage per device, got "
       r'num_virtual_stages=2; set num_virtual_stages=1 \(and as many '
       r'times K cells\)\.$'),
      ('InterleavedM', lambda: registry.Make('interleaved_1f1b', 2, 5, 2),
       r"^Schedule 'interleaved_1f1b' needs M a multiple of K: M=5, K=2; "
       r'set num_micro_batches to 4 or 6\.$'),
      ('OneFOneBV', lambda: registry.Make('1f1b', 2, 4, 2),
       r"^Schedule '1f1b' runs one stage per device, got "
       r'num_virtual_stages=2; set num_virtual_stages=1 \(and as many '
       r'times K cells\)\.$'),
      ('InterleavedV', lambda: registry.Make('interleaved_1f1b', 2, 4, 1),
       r"^Schedule 'interleaved_1f1b' runs 2 or more stages per device, "
       r'got num_virtual_stages=1; set num_virtual_stages >= 2'),
      ('ZbvV', lambda: registry.Make('zb_v', 2, 4, 3),
       r"^Schedule 'zb_v' runs 2 stages per device, got "
       r'num_virtual_stages=3; set num_virtual_stages=2 '),
      ('WrongK', lambda: registry.Make('zb_v', 2, 4, 2) and registry.Make(
          'gpipe', 2, 0),
       r"^Schedule 'gpipe': M=0; set num_micro_batches >= 1\.$"),
      ('NoDevices', lambda: registry.Make('gpipe', 0, 4),
       r'^A schedule needs K >= 1 devices, .* got K=0, M=4, V=1\.$'),
  )
  def testBadMake(self, make, regex):
    with self.assertRaisesRegex(ValueError, regex):
      make()


class AllReduceTest(absltest.TestCase):
  """A(s), the all-reduce of stage s over its replicas' copies."""

  def testAfterEachStagesLastBackward(self):
    self.assertEqual(
        schedule.WithAllReduce(schedule.OneFOneB(2, 3)).order,
        _Rows('F0.0 F0.1 B0.0 F0.2 B0.1 B0.2 A0.0',
              'F1.0 B1.0 F1.1 B1.1 F1.2 B1.2 A1.0'))
    # V=2: device 0's stage 2 ends before its stage 0, whose backwards
    # go on while A2 runs.
    self.assertEqual(
        schedule.WithAllReduce(schedule.GPipe(1, 2, 2)).order,
        _Rows('F0.0 F0.1 F1.0 F1.1 B1.1 B1.0 A1.0 B0.1 B0.0 A0.0'))
    self.assertEqual(
        schedule.WithAllReduce(schedule.ZeroBubbleH1(2, 2)).order,
        _Rows('F0.0 F0.1 B0.0 W0.0 B0.1 W0.1 A0.0',
              'F1.0 B1.0 F1.1 B1.1 W1.0 W1.1 A1.0'))
    schedule.Validate(schedule.WithAllReduce(schedule.OneFOneB(3, 4)))
    forwards = schedule.GPipe(2, 2).Only('F')
    self.assertEqual(schedule.WithAllReduce(forwards), forwards)

  def testAnAllReduceBeforeItsStagesBackwardIsRefused(self):
    with self.assertRaisesRegex(
        ValueError, r"^Schedule 'hand': A\(stage 0, micro-batch 0\) on "
        r'device 0 comes before B\(stage 0, micro-batch 1\); the all-reduce '
        r"goes after the stage's last backward\.$"):
      schedule.Validate(_Table(2, (0,), 'F0.0 F0.1 B0.0 A0.0 B0.1'))

  def testTheExchangeHoldsNoDevice(self):
    table = schedule.WithAllReduce(schedule.GPipe(1, 2, 2))
    plain = schedule.Simulate(schedule.GPipe(1, 2, 2))
    sim = schedule.Simulate(table, all_reduce_s=[5.0, 5.0])
    # B0.1 starts as B1.0 ends, while A1 runs; A0 ends the step.
    self.assertEqual(sim.times[A('B', 0, 1)], plain.times[A('B', 0, 1)])
    self.assertEqual(sim.times[A('A', 1, 0)], (8.0, 13.0))
    self.assertEqual(sim.step, plain.step + 5.0)
    self.assertEqual(sim.busy, plain.busy)
    self.assertEqual(A('A', 1, 0).short, 'A')


class SimulateTest(absltest.TestCase):

  def testBubbleStepAndPeaks(self):
    for name, k, m, v in _Cases():
      with self.subTest(name=name, k=k, m=m, v=v):
        table = registry.Make(name, k, m, v)
        sim = schedule.Simulate(table)
        # Every device runs M V forwards of 1 and backwards of 2.
        self.assertEqual((3.0 * m * v,) * k, sim.busy)
        if name == 'interleaved_1f1b':
          self.assertEqual(3.0 * (v * m + k - 1), sim.step)
          self.assertAlmostEqual((k - 1) / (v * m + k - 1), sim.bubble)
        elif v == 1:
          self.assertEqual(3.0 * (m + k - 1), sim.step)
          self.assertAlmostEqual((k - 1) / (m + k - 1), sim.bubble)
        if name == '1f1b':
          self.assertEqual(tuple(min(k - d, m) for d in range(k)),
                           sim.peak_in_flight)
        elif name == 'gpipe':
          self.assertEqual((m,) * (k * v), sim.peak_in_flight)
        self.assertEqual(
            tuple(_Leading(name, k, d, m, v) for d in range(k)),
            sim.peak_device_in_flight)
        self.assertEqual(sim.peak_device_in_flight[0],
                         schedule.InFlight(table)[1][0])

  def testZeroBubbleThirdOfTheBubbleAndKHeld(self):
    """ZB-H1 with F = B = W: (K-1)/(3M+K-1) for M >= K (1F1B, backward
    B + W: (K-1)/(M+K-1)); every stage holds at most K micro-batches from
    F to W, and the validator wants every W."""
    for k in range(1, 6):
      for m in range(k, 13):
        table = registry.Make('zb_h1', k, m)
        self.assertTrue(table.split_backward)
        sim = schedule.Simulate(table)
        self.assertAlmostEqual(sim.bubble, (k - 1) / (3 * m + k - 1),
                               msg=(k, m))
        self.assertLessEqual(max(sim.peak_in_flight), k, (k, m))
        self.assertEqual(sim.busy, (3.0 * m,) * k)
    table = registry.Make('zb_h1', 2, 2)
    dropped = tuple(tuple(a for a in row if a != A('W', 1, 1))
                    for row in table.order)
    with self.assertRaisesRegex(ValueError, r'W\(stage 1, micro-batch 1\) '
                                'is missing'):
      schedule.Validate(schedule.Schedule('zb', 2, (0, 1), dropped))

  def testInterleavedInFlightByHand(self):
    # Counted along the literal K=2 V=2 M=4 table above.
    stage_peak, device_peak = schedule.InFlight(
        schedule.Interleaved1F1B(2, 4, 2))
    self.assertEqual((4, 3, 2, 1), stage_peak)
    self.assertEqual((5, 3), device_peak)

  def testCostsAndHop(self):
    # 1F1B K=2 M=2: dev 0 F0.0 F0.1 B0.0 B0.1, dev 1 F1.0 B1.0 F1.1 B1.1.
    # Stage 0: F 1, B 2; stage 1: F 2, B 3; 0.5 for each hand-off.
    table = schedule.OneFOneB(2, 2)
    sim = schedule.Simulate(table, [1, 2], [2, 3], hop_s=[0.5])
    self.assertEqual({
        A('F', 0, 0): (0, 1), A('F', 0, 1): (1, 2),
        A('F', 1, 0): (1.5, 3.5), A('B', 1, 0): (3.5, 6.5),
        A('F', 1, 1): (6.5, 8.5), A('B', 1, 1): (8.5, 11.5),
        A('B', 0, 0): (7, 9), A('B', 0, 1): (12, 14),
    }, sim.times)
    self.assertEqual(14, sim.step)
    self.assertEqual((6, 10), sim.busy)
    self.assertAlmostEqual(3 / 7, sim.bubble)
    self.assertAlmostEqual(8 / 14, sim.DeviceBubble(0))

  def testHopPerBoundaryAndOverhead(self):
    # GPipe K=3 M=1, unit costs: the hops 0.5 and 10 fall on boundaries
    # 0|1 and 1|2, on the forward and on the backward.
    sim = schedule.Simulate(schedule.GPipe(3, 1), hop_s=[0.5, 10])
    self.assertEqual({
        A('F', 0, 0): (0, 1), A('F', 1, 0): (1.5, 2.5),
        A('F', 2, 0): (12.5, 13.5), A('B', 2, 0): (13.5, 15.5),
        A('B', 1, 0): (25.5, 27.5), A('B', 0, 0): (28, 30),
    }, sim.times)
    # Stages 0 and 1 share device 0 when K=1, V=2: no hop between them.
    sim = schedule.Simulate(schedule.GPipe(1, 2, 2), hop_s=[5],
                            overhead_s=0.5)
    self.assertEqual(4 * 1.5 + 4 * 2.5, sim.step)
    self.assertEqual(0.0, sim.bubble)

  def testHopsThatTakeTheDevicesTime(self):
    # GPipe K=2 M=2, F 1, B 2, hops of 0.5 taking half of the sender's
    # time and all of the receiver's. The sender's next action waits
    # 0.25 after each send. F1.1's input crosses 2.25-2.75 while device 1
    # runs F1.0 until 2.5: it lasts 0.25 longer. F1.0's and B0.1's
    # receivers wait idle for theirs and lose nothing; B0.0's crosses
    # 8.25-8.75 while device 0 runs B0.1 until 8.5: 0.25 longer.
    sim = schedule.Simulate(schedule.GPipe(2, 2), [1, 1], [2, 2],
                            hop_s=[0.5], hop_busy=(0.5, 1.0))
    self.assertEqual({
        A('F', 0, 0): (0, 1), A('F', 0, 1): (1.25, 2.25),
        A('F', 1, 0): (1.5, 2.5), A('F', 1, 1): (2.75, 4),
        A('B', 1, 1): (4, 6), A('B', 1, 0): (6.25, 8.25),
        A('B', 0, 1): (6.5, 8.5), A('B', 0, 0): (8.75, 11),
    }, sim.times)
    self.assertEqual((6.75, 6.75), sim.busy)
    free = schedule.Simulate(schedule.GPipe(2, 2), [1, 1], [2, 2],
                             hop_s=[0.5])
    self.assertEqual((10, (6, 6)), (free.step, free.busy))

  def testWrongNumberOfCosts(self):
    table = schedule.GPipe(2, 2)
    with self.assertRaisesRegex(
        ValueError, r'^forward_s has 1 entries for 2 stages; give one per '
        r'stage\.$'):
      schedule.Simulate(table, forward_s=[1])
    with self.assertRaisesRegex(ValueError, r'^backward_s has 3 entries'):
      schedule.Simulate(table, backward_s=[1, 2, 3])
    with self.assertRaisesRegex(
        ValueError, r'^hop_s has 2 entries for 2 stages; give one per '
        r'boundary, 1\.$'):
      schedule.Simulate(table, hop_s=[1, 2])


class PictureTest(absltest.TestCase):

  def testTicks(self):
    # Every action one tick: 1F1B K=2 M=2.
    self.assertEqual({
        A('F', 0, 0): 0, A('F', 0, 1): 1, A('B', 0, 0): 3, A('B', 0, 1): 5,
        A('F', 1, 0): 1, A('B', 1, 0): 2, A('F', 1, 1): 3, A('B', 1, 1): 4,
    }, schedule.Ticks(schedule.OneFOneB(2, 2)))

  def testTimeline(self):
    self.assertEqual(
        'dev 0: F0 F1 .  B0 F2 B1 F3 B2 .  B3\n'
        'dev 1: .  F0 B0 F1 B1 F2 B2 F3 B3 .',
        schedule.Timeline(schedule.OneFOneB(2, 4)))

  def testTimelineWithStages(self):
    self.assertEqual(
        'dev 0: F0s0 F1s0 F0s2 F1s2 .    .    B1s2 B0s2 B1s0 B0s0\n'
        'dev 1: .    F0s1 F1s1 F0s3 F1s3 B1s3 B0s3 B1s1 B0s1 .',
        schedule.Timeline(schedule.GPipe(2, 2, 2)))

  def testOnlyActionsStagesOf(self):
    table = schedule.Interleaved1F1B(2, 2, 2)
    forwards = table.Only('F')
    self.assertEqual(_Rows('F0.0 F0.1 F2.0 F2.1', 'F1.0 F1.1 F3.0 F3.1'),
                     forwards.order)
    self.assertEqual((table.name, table.stage_devices),
                     (forwards.name, forwards.stage_devices))
    self.assertEqual(list(_Row('F0.0 F0.1 F2.0 F2.1 F1.0 F1.1 F3.0 F3.1')),
                     table.Actions('F'))
    self.assertEqual(list(_Row('B2.0 B2.1 B0.0 B0.1 B3.0 B3.1 B1.0 B1.1')),
                     table.Actions('B'))
    self.assertLen(table.Actions(), 16)
    self.assertEqual([0, 2], table.StagesOf(0))
    self.assertEqual([1, 3], table.StagesOf(1))
    self.assertEqual('dev 0: F0.0 B0.0\ndev 1: F1.0 B1.0',
                     schedule.OneFOneB(2, 1).Text())


if __name__ == '__main__':
  absltest.main()
