"""progress: the status line, its ETA, and when it prints."""

import io

from absl.testing import absltest

from lingvo_pipe.core import progress


class _Clock:

  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


class ProgressTest(absltest.TestCase):

  def testFormatDuration(self):
    self.assertEqual(progress.FormatDuration(42.4), '42s')
    self.assertEqual(progress.FormatDuration(185), '3m05s')
    self.assertEqual(progress.FormatDuration(3720), '1h02m')
    self.assertEqual(progress.FormatDuration(-3), '0s')

  def testLineAndEta(self):
    clock, out = _Clock(), io.StringIO()
    bar = progress.Progress(100, start_step=0, stream=out, clock=clock,
                            min_interval=0)
    self.assertIn('ETA ?', bar.Update(0, 8, {'loss': 2.5}))
    clock.now += 10.0
    line = bar.Update(20, 8, {'loss': 1.25})  # 2 steps/s, 80 steps left
    self.assertEqual(line, 'step 20/100  loss 1.25  16.0 examples/s  ETA 40s')
    self.assertAlmostEqual(bar.Eta(20), 40.0)
    self.assertEqual(out.getvalue().count('\n'), 2)

  def testResumedRunCountsFromItsStartStep(self):
    clock = _Clock()
    bar = progress.Progress(1000, start_step=900, stream=io.StringIO(),
                            clock=clock)
    clock.now += 60.0  # the first step traces: it only starts the clock
    bar.Update(901, 1, {})
    self.assertIsNone(bar.steps_per_second)
    clock.now += 5.0
    bar.Update(951, 1, {})
    self.assertAlmostEqual(bar.steps_per_second, 10.0)
    self.assertAlmostEqual(bar.Eta(951), 4.9)

  def testANotedStepPrintsAtOnceAndIsLeftOutOfTheRate(self):
    clock, out = _Clock(), io.StringIO()
    bar = progress.Progress(100, stream=out, clock=clock, min_interval=60.0)
    bar.Update(1, 4, {})
    clock.now += 2.0
    bar.Update(21, 4, {})  # 10 steps/s
    clock.now += 30.0  # a new batch shape: traced
    line = bar.Update(22, 4, {}, note='first step of a batch of shape (4, 8)')
    self.assertTrue(line.endswith('ETA 8s  (first step of a batch of shape '
                                  '(4, 8))'), line)
    self.assertAlmostEqual(bar.steps_per_second, 10.0)
    clock.now += 1.0
    bar.Update(32, 4, {})  # not due: 60 s between plain lines
    self.assertEqual([line.split()[1] for line in out.getvalue().splitlines()],
                     ['1/100', '22/100'])

  def testLogOutputIsRateLimitedButTheLastStepPrints(self):
    clock, out = _Clock(), io.StringIO()
    bar = progress.Progress(10, stream=out, clock=clock, min_interval=5.0)
    for step in range(1, 11):
      clock.now += 1.0
      bar.Update(step, 4, {'loss': 1.0})
    lines = out.getvalue().splitlines()
    self.assertEqual([line.split()[1] for line in lines],
                     ['1/10', '6/10', '10/10'])


if __name__ == '__main__':
  absltest.main()
