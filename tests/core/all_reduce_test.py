"""all_reduce: buckets, and the sum over copies on logical CPUs.

Each copy gets every leaf's sum over the copies, bitwise the same on every
device, by the collective (Sum) and by placed ops (PlacedSum, Exchange);
buckets close at the byte bound and at a change of dtype.
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

  def testPlacedOpsSumEveryLeafInReplicaOrder(self):
    cpus = devices.SplitCpu(3)
    rng = np.random.default_rng(1)
    shapes = ([3, 5], [7], [], [2, 2])
    values = [[rng.normal(size=shape) for shape in shapes] for _ in cpus]

    @tf.function(autograph=False)
    def Step():
      copies = []
      for device, mine in zip(cpus, values):
        with tf.device(device):
          # float32, float64 and None leaves: buckets by dtype.
          copies.append([tf.constant(mine[0], tf.float32), None,
                         tf.constant(mine[1], tf.float64),
                         tf.constant(mine[2], tf.float64),
                         tf.constant(mine[3], tf.float32)])
      out = all_reduce.PlacedSum(copies, cpus)
      for r, copy in enumerate(out):  # each result on its own device
        for t in copy:
          if t is not None:
            self.assertEqual(tf.DeviceSpec.from_string(t.device),
                             tf.DeviceSpec.from_string(cpus[r]))
      return out

    got = Step()
    for r in range(3):
      self.assertIsNone(got[r][1])
    for i, dtype in ((0, np.float32), (2, np.float64), (3, np.float64),
                     (4, np.float32)):
      v = [values[r][[0, None, 1, 2, 3][i]].astype(dtype) for r in range(3)]
      want = (v[0] + v[1]) + v[2]  # replica order, as the owner adds
      self.assertEqual(got[0][i].numpy().tobytes(), want.tobytes())
      for r in (1, 2):
        self.assertEqual(got[r][i].numpy().tobytes(),
                         got[0][i].numpy().tobytes())

  def testUnitsCoverEveryLeafOnceAndShareTheBytesEvenly(self):
    # One large leaf (cut in aligned pieces), mid-sized ones (whole), small
    # ones (grouped by dtype), a None.
    leaves = ([tf.zeros([1000, 64])] + [tf.zeros([64, 64])] * 9 + [None]
              + [tf.zeros([8])] * 5 + [tf.zeros([3], tf.float64)] * 2)
    sizes = [0 if t is None else t.shape.num_elements() * t.dtype.size
             for t in leaves]
    for r_count in (2, 3, 4):
      units = all_reduce.Units(leaves, r_count)
      self.assertEqual(units, all_reduce.Units(leaves, r_count))
      covered = {}
      for unit in units:
        self.assertLess(unit.owner, r_count)
        if unit.stop is None:
          for i in unit.leaves:
            covered[i] = covered.get(i, 0) + sizes[i]
          self.assertEqual(unit.nbytes, sum(sizes[i] for i in unit.leaves))
          self.assertLen({leaves[i].dtype for i in unit.leaves}, 1)
        else:
          (i,) = unit.leaves
          self.assertEqual(unit.start % 16, 0)  # 64 bytes of float32
          covered[i] = covered.get(i, 0) + unit.nbytes
      self.assertEqual(covered, {i: n for i, n in enumerate(sizes) if n})
      pieces = [u for u in units if u.stop is not None]
      self.assertGreater(len(pieces), r_count)  # the large leaf is cut
      self.assertEqual(sorted((u.start, u.stop) for u in pieces),
                       [(u.start, u.stop) for u in pieces])
      self.assertEqual(pieces[-1].stop, 64000)
      loads = [sum(u.nbytes for u in units if u.owner == d)
               for d in range(r_count)]
      # Largest first to the least loaded: no owner is over its share by
      # more than the largest unit.
      self.assertLessEqual(max(loads) - sum(loads) / r_count,
                           max(u.nbytes for u in units))
      self.assertLess(max(loads) / (sum(loads) / r_count), 1.1)

  def testPlacedOpsSumLeavesCutInPiecesAndWholeExactly(self):
    cpus = devices.SplitCpu(3)
    rng = np.random.default_rng(2)
    shapes = ([1000, 33], [64, 64], [5], [64, 64])
    values = [[rng.normal(size=shape).astype(np.float32)
               for shape in shapes] for _ in cpus]

    @tf.function(autograph=False)
    def Step():
      copies = []
      for device, mine in zip(cpus, values):
        with tf.device(device):
          copies.append([tf.constant(v) for v in mine])
      return all_reduce.PlacedSum(copies, cpus)

    units = all_reduce.Units([tf.zeros(s) for s in shapes], 3)
    self.assertTrue(any(u.stop is not None for u in units))
    self.assertTrue(any(u.stop is None for u in units))
    got = Step()
    for i in range(len(shapes)):
      want = (values[0][i] + values[1][i]) + values[2][i]
      for r in range(3):
        self.assertEqual(got[r][i].shape, shapes[i])
        self.assertEqual(got[r][i].numpy().tobytes(), want.tobytes())

  def testAnExchangeSumsWhenItsLastReplicaArrives(self):
    cpus = devices.SplitCpu(3)[:2]
    done = {}

    @tf.function(autograph=False)
    def Step():
      exchange = all_reduce.Exchange(2, cpus)
      with tf.device(cpus[0]):
        exchange.Add(0, [tf.constant([1.0, 2.0])],
                     lambda sums: done.setdefault(0, sums))
      self.assertEqual((exchange.results, done), ({}, {}))
      with tf.device(cpus[1]):
        exchange.Add(1, [tf.constant([10.0, 20.0])],
                     lambda sums: done.setdefault(1, sums))
      self.assertEqual(sorted(done), [0, 1])
      with self.assertRaisesRegex(ValueError, 'replica 1 added its sums '
                                  'twice'):
        exchange.Add(1, [tf.constant([0.0, 0.0])], lambda sums: None)
      return exchange.results[0][0], exchange.results[1][0]

    for copy in Step():
      self.assertAllEqual(copy, [11.0, 22.0])

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
