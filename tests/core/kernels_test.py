"""Tests of lingvo_pipe.core.kernels: values and gradients against TF's own
einsum and convolution kernels (float64), and the ops each one traces to.
"""

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from lingvo_pipe.core import kernels

_TOL = dict(atol=1e-10, rtol=1e-10)


def _Rand(*shape, seed=0):
  return np.random.default_rng(seed).normal(size=shape)


class MatmulLastDimTest(tf.test.TestCase, parameterized.TestCase):
  """The weight gradient of a projection over [..., i] inputs."""

  def _LargestGradientTensor(self, fn, x_shape, w_shape):
    """Elements of the largest tensor in the traced gradient graph."""
    w = tf.Variable(tf.zeros(w_shape, tf.float32))

    def Grads(x):
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(fn(x, w)))
      return tape.gradient(loss, [x, w])

    graph = tf.function(Grads, autograph=False).get_concrete_function(
        tf.TensorSpec(x_shape, tf.float32)).graph
    return max(t.shape.num_elements() or 0
               for op in graph.get_operations() for t in op.outputs)

  @parameterized.parameters(False, True)
  def testNoPerRowOuterProducts(self, transpose_w):
    # TF's einsum gradient for '...i,io->...o' builds [i, o, 8, 16] (24576
    # elements x rows) and sums it; ours never holds more than the
    # largest of x, y, w.
    x_shape, (i, o) = [8, 16, 12], (12, 20)
    w_shape = [o, i] if transpose_w else [i, o]
    ours = self._LargestGradientTensor(
        lambda x, w: kernels.MatmulLastDim(x, w, transpose_w=transpose_w),
        x_shape, w_shape)
    self.assertLessEqual(ours, 8 * 16 * o)
    eq = '...i,oi->...o' if transpose_w else '...i,io->...o'
    tfs = self._LargestGradientTensor(
        lambda x, w: tf.einsum(eq, x, w), x_shape, w_shape)
    self.assertEqual(8 * 16 * i * o, tfs)  # what it replaces

  @parameterized.parameters(False, True)
  def testThreeMatMulsAndNoEinsum(self, transpose_w):
    # TF's CPU Einsum kernel is 1.3-2x slower than MatMul on the same
    # product (docs/DESIGN.md section 11): the forward and both gradients
    # are each one MatMul.
    w = tf.Variable(tf.zeros([20, 12] if transpose_w else [12, 20]))

    def Grads(x):
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(kernels.MatmulLastDim(x, w, transpose_w))
      return tape.gradient(loss, [x, w])

    for shape in ([8, 16, 12], [None, 16, 12], [None, None, 12]):
      graph = tf.function(Grads, autograph=False).get_concrete_function(
          tf.TensorSpec(shape, tf.float32)).graph
      types = [op.type for op in graph.get_operations()]
      self.assertEqual(3, types.count('MatMul'), shape)
      self.assertNotIn('Einsum', types)

  def testWrongLastDimension(self):
    # [4, 6] reshapes to rows of 3 without complaint: the check must catch
    # it, statically and at run time.
    w = tf.zeros([3, 2])
    with self.assertRaisesRegex(ValueError, "last dimension must be 3"):
      kernels.MatmulLastDim(tf.zeros([4, 6]), w)
    fn = tf.function(lambda x: kernels.MatmulLastDim(x, w), autograph=False)
    with self.assertRaises(tf.errors.InvalidArgumentError):
      fn.get_concrete_function(tf.TensorSpec([4, None], tf.float32))(
          tf.zeros([4, 6]))
    self.assertEqual([4, 2], fn(tf.zeros([4, 3])).shape.as_list())

  @parameterized.parameters(([5, 3],), ([2, 5, 3],), ([2, 2, 5, 3],))
  def testEqualsEinsumWithItsGradients(self, shape):
    w = tf.constant(_Rand(3, 4, seed=1))
    x = tf.constant(_Rand(*shape))
    r = tf.constant(_Rand(*shape[:-1], 4, seed=2))
    for transpose_w, eq, w_in in ((False, '...i,io->...o', w),
                                  (True, '...i,oi->...o', tf.transpose(w))):
      with tf.GradientTape(persistent=True) as tape:
        tape.watch([x, w_in])
        ours = kernels.MatmulLastDim(x, w_in, transpose_w=transpose_w)
        ref = tf.einsum(eq, x, w_in)
        loss_ours, loss_ref = tf.reduce_sum(ours * r), tf.reduce_sum(ref * r)
      self.assertAllClose(ref, ours, **_TOL)
      for g, g_ref in zip(tape.gradient(loss_ours, [x, w_in]),
                          tape.gradient(loss_ref, [x, w_in])):
        self.assertAllClose(g_ref, g, **_TOL)


class Conv2DTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.product(
      kernel=[(1, 7), (7, 1), (3, 3), (2, 4)],
      stride=[(1, 1), (2, 2), (1, 2), (3, 2)],
      padding=['SAME', 'VALID'], image=[(5, 9), (8, 8)])
  def testConvGradientsMatchTfKernels(self, kernel, stride, padding, image):
    # Conv2D's CPU gradients (a forward convolution for the input,
    # im2col for the filter) against TF's backprop kernels.
    if padding == 'VALID' and (kernel[0] > image[0] or kernel[1] > image[1]):
      self.skipTest('the filter is larger than the image')
    x = tf.constant(_Rand(2, *image, 3))
    w = tf.constant(_Rand(*kernel, 3, 4, seed=2))
    with tf.GradientTape() as tape:
      tape.watch([x, w])
      y = kernels.Conv2D(x, w, stride, padding)
    dy = tf.constant(_Rand(*y.shape, seed=3))
    dx, dw = tape.gradient(y, [x, w], output_gradients=dy)
    strides = [1, *stride, 1]
    self.assertAllClose(tf.nn.conv2d(x, w, strides, padding), y, **_TOL)
    self.assertAllClose(tf.raw_ops.Conv2DBackpropInput(
        input_sizes=x.shape, filter=w, out_backprop=dy, strides=strides,
        padding=padding), dx, **_TOL)
    self.assertAllClose(tf.raw_ops.Conv2DBackpropFilter(
        input=x, filter_sizes=w.shape, out_backprop=dy, strides=strides,
        padding=padding), dw, **_TOL)


if __name__ == '__main__':
  absltest.main()
