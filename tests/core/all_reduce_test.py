"""all_reduce: buckets, and the sum over copies on logical CPUs.

Each copy gets every leaf's sum over the copies, bitwise the same on every
device; buckets close at the byte bound and at a change of dtype.
"""

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from lingvo_pipe.core import devices

devices.SplitCpu(3)

from lingvo_pipe.core import all_reduce  # noqa: E402


class AllReduceTest(tf.test.TestCase):

  def testBucketsCloseAtTheBoundAndAtADtypeChange(self):
    leaves = [tf.zeros([256]), None, tf.zeros([256]), tf.zeros([1]),
              tf.zeros([4], tf.float64), tf.zeros([2], tf.float64)]
    # 256 float32 = 1 KiB: a bucket is full after one of them.
    self.assertEqual(all_reduce.Buckets(leaves, bucket_bytes=1024),
                     [[0], [2], [3], [4, 5]])
    self.assertEqual(all_reduce.Buckets(leaves, bucket_bytes=4096),
                     [[0, 2, 3], [4, 5]])

  def testEveryCopyGetsTheSameSum(self):
    cpus = devices.SplitCpu(3)
    rng = np.random.default_rng(0)
    values = [[rng.normal(size=shape).astype(np.float32)
               for shape in ([3, 5], [7], [])] for _ in cpus]

    @tf.function(autograph=False)
    def Step():
      out = []
      for device, mine in zip(cpus, values):
        with tf.device(device):
          leaves = [tf.constant(v) for v in mine]
        out.append(all_reduce.Sum(leaves, cpus, device, 'test'))
      return out

    got = [[t.numpy() for t in copy] for copy in Step()]
    for i in range(3):
      want = values[0][i] + values[1][i] + values[2][i]
      np.testing.assert_allclose(got[0][i], want, rtol=1e-6)
      for copy in got[1:]:
        self.assertEqual(copy[i].tobytes(), got[0][i].tobytes())

  def testOneCopyIsLeftAlone(self):
    x = tf.constant([1.0, 2.0])
    self.assertIs(all_reduce.Sum([x, None], ['/device:CPU:0'],
                                 '/device:CPU:0', 'one')[0], x)

  def testKeysAreTheSameForTheSameThing(self):
    self.assertEqual(all_reduce.InstanceKey(('a', 1)),
                     all_reduce.InstanceKey(('a', 1)))
    self.assertNotEqual(all_reduce.InstanceKey(('a', 1)),
                        all_reduce.InstanceKey(('a', 2)))
    self.assertEqual(all_reduce.GroupKey(['/device:CPU:0', '/device:CPU:1']),
                     all_reduce.GroupKey(['/device:CPU:0', '/device:CPU:1']))
    self.assertNotEqual(
        all_reduce.GroupKey(['/device:CPU:0', '/device:CPU:1']),
        all_reduce.GroupKey(['/device:CPU:1', '/device:CPU:2']))


if __name__ == '__main__':
  absltest.main()
