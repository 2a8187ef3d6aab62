"""The planner's report on a model in length buckets: each bucket on the
planned split, its partitions measured at the bucket's own shape."""

from unittest import mock

from absl.testing import absltest

from lingvo_pipe.core import devices

devices.SplitCpu(2)

from lingvo_pipe.tools import plan  # noqa: E402
from lingvo_pipe.tools import plan_search  # noqa: E402

_BUCKETS = ('train_input.bucket_upper_bound : [10, 20]\n'
            'train_input.bucket_batch_limit : [8, 4]')


class PlanBucketsTest(absltest.TestCase):

  def testEachBucketIsPredictedAtItsOwnShape(self):
    measured, predicted = [], []
    measure, predict = plan._MeasurePartitions, plan_search.Predicted  # pylint: disable=protected-access

    def Measure(result, layers, shapes, *args):
      measured.append(shapes.vec.as_list())
      return measure(result, layers, shapes, *args)

    def Predict(*args, **kwargs):
      predicted.append(predict(*args, **kwargs))
      return predicted[-1]

    with mock.patch.object(plan, '_MeasurePartitions', Measure), \
        mock.patch.object(plan_search, 'Predicted', Predict):
      report = plan.Main(['--model=mt.folder.TransformerTinyFolder',
                          '--num_partitions=2', '--num_micro_batches=2',
                          '--num_timing_runs=1',
                          f'--model_params_override={_BUCKETS}'])
    # Planned for the batch holding the most tokens (tie: the first),
    # then each other bucket: micro-batches of batch / M at its bound (the
    # planned one is not measured twice).
    self.assertEqual(measured, [[4, 10, 64], [2, 20, 64]])
    rows = report.split('Length buckets')[1].splitlines()[2:]
    self.assertLen(rows, 2)
    for row, (bound, batch), want in zip(rows, [(10, 8), (20, 4)],
                                         predicted[-2:]):
      self.assertEqual(row.split()[:5], [
          str(bound), str(batch), f'{want.step_s:.3f}', 's',
          f'{want.idle:.1%}'])
      self.assertEqual(want.batch_size, batch)
    peaks = [p.peak_bytes for p in predicted[-2:]]
    self.assertEqual(['(the most)' in row for row in rows],
                     [p == max(peaks) for p in peaks])

  def testAnMThatSplitsNoBucketIsOneLineBeforeMeasuring(self):
    with mock.patch.object(plan, 'ProfileAt') as profile, \
        self.assertRaisesRegex(ValueError, r'^length buckets \(bound, '
                               r'batch\) \[\(20, 4\)\]: the batch does not '
                               'split into M=8 micro-batches'):
      plan.Main(['--model=mt.folder.TransformerTinyFolder',
                 '--num_partitions=2', '--num_micro_batches=8',
                 f'--model_params_override={_BUCKETS}'])
    profile.assert_not_called()


if __name__ == '__main__':
  absltest.main()
