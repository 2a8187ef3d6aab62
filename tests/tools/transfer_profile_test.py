"""transfer_profile: the fitted cost line, the measuring against a known
cost, and the hand-off and all-reduce measured between two logical CPUs
of this process (they run; what they read there is noise about 0)."""

import time

from absl.testing import absltest

from lingvo_pipe.core import devices

devices.SplitCpu(4)

from lingvo_pipe.tools import transfer_profile  # noqa: E402

MIB = 2**20


class TransferProfileTest(absltest.TestCase):

  def testFitIsTheLineThroughThePoints(self):
    cost = transfer_profile.Fit([(1000, 0.002), (3000, 0.004),
                                 (5000, 0.006)])
    self.assertAlmostEqual(cost.latency_s, 0.001, places=12)
    self.assertAlmostEqual(cost.seconds_per_byte, 1e-6, places=15)
    self.assertAlmostEqual(cost.Seconds(2000), 0.003, places=12)
    self.assertEqual(cost.Seconds(0), 0.0)  # nothing crosses, no latency
    self.assertTrue(cost.measured)
    self.assertFalse(transfer_profile.TransferCost().measured)

  def testFitClampsAtZero(self):
    # Noise can make the larger size read faster: no negative cost.
    cost = transfer_profile.Fit([(1000, 0.004), (3000, 0.002)])
    self.assertEqual(cost.seconds_per_byte, 0.0)
    self.assertAlmostEqual(cost.latency_s, 0.003, places=12)
    self.assertEqual(transfer_profile.Fit([(1, -1.0), (2, -1.0)]).latency_s,
                     0.0)
    with self.assertRaisesRegex(ValueError, 'two or more distinct sizes'):
      transfer_profile.Fit([(1000, 0.002), (1000, 0.003)])

  def testPointsTakeTheTwinAwayAndTheFitFindsAKnownCost(self):
    """Calls that sleep a known latency and rate, beside a twin that
    sleeps 15 ms: the fit of the points is that cost, the twin taken
    away (left in, the latency would read 15 ms more). Sleeps of tens of
    ms: a loaded machine oversleeps by milliseconds (seen: 2.8 ms on a 4
    ms latency, the suite's two files at once)."""
    latency, per_mib, twin = 0.02, 0.01, 0.015

    class Done:
      def numpy(self):
        return None

    def Measured(size):
      time.sleep(latency + twin + per_mib * size / MIB)
      return Done()

    def Twin(unused_size):
      time.sleep(twin)
      return Done()

    cost = transfer_profile.Fit(transfer_profile._Points(  # pylint: disable=protected-access
        Measured, Twin, (MIB, 2 * MIB, 4 * MIB), num_runs=5))
    self.assertAlmostEqual(cost.latency_s, latency, delta=0.0075)
    self.assertAlmostEqual(cost.seconds_per_byte * MIB, per_mib,
                           delta=0.25 * per_mib)

  def testMeasuredBetweenTwoDevicesOfThisProcess(self):
    """Runs and names its devices. What it measures in one process is
    noise about 0 (logical CPUs share memory; the fit clamps it): the
    measuring is checked against a known cost above, and a measured
    hand-off between worker processes by plan_test."""
    names = devices.SplitCpu(4)
    cost = transfer_profile.Measure(names[0], names[1], num_runs=1)
    self.assertTrue(cost.measured)
    self.assertEqual(cost.between, f'{names[0]} -> {names[1]}')

  def testShareOfTheDevicesTime(self):
    names = devices.SplitCpu(4)
    shares = transfer_profile.MeasureBusy(names[0], names[1], num_runs=1,
                                          size=2**16, count=2)
    # Sender, receiver: noise in one process; between worker processes
    # plan_test finds them above 0.
    self.assertLen(shares, 2)
    cost = transfer_profile.TransferCost(
        latency_s=0.001, seconds_per_byte=1e-3 / MIB, between='w0 -> w1',
        measured=True, sender_busy=0.6, receiver_busy=0.75)
    self.assertEqual(cost.busy, (0.6, 0.75))
    self.assertEqual(str(cost), '1.00 ms + 1.000 ms/MiB, taking 60% of it '
                     'from the sender and 75% from the receiver (w0 -> w1)')
    self.assertEqual(transfer_profile.TransferCost().busy, (0.0, 0.0))

  def testAllReduceOverRCopiesFromTwo(self):
    cost = transfer_profile.TransferCost(latency_s=0.002,
                                         seconds_per_byte=1e-3 / MIB,
                                         measured=True)
    seconds = transfer_profile.AllReduceSeconds
    self.assertEqual(seconds(cost, 8 * MIB, 1), 0.0)  # one copy
    self.assertEqual(seconds(cost, 0, 4), 0.0)  # nothing to sum
    # Two copies: as measured. R copies: 2 ring steps and
    # 2 (R-1) / R of the bytes sent.
    self.assertAlmostEqual(seconds(cost, 8 * MIB, 2), 0.002 + 0.008,
                           places=12)
    self.assertAlmostEqual(seconds(cost, 8 * MIB, 4), 3 * 0.002 + 0.012,
                           places=12)

  def testAllReduceMeasuredOverTwoDevicesOfThisProcess(self):
    names = devices.SplitCpu(4)
    cost = transfer_profile.MeasureAllReduce(names[:2], sizes=(2**16, 2**18),
                                             num_runs=1)
    self.assertTrue(cost.measured)  # its size: noise in one process
    self.assertIn(names[0], cost.between)


if __name__ == '__main__':
  absltest.main()
