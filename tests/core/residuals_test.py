"""Tests of residuals.SplitCell: the kept-activation forward and backward."""

import tensorflow as tf

from lingvo_pipe.core import residuals

SCALE = tf.constant([[0.5, -2.0, 3.0]], tf.float64)  # captured by the cell


def _Cell(theta_leaves, x):
  """Two outputs: tanh(x @ w) * SCALE, and x * w[0] (per column)."""
  w, = theta_leaves
  h, = x
  return [tf.tanh(h @ w) * SCALE, h * w[0]]


def _Values():
  w = tf.random.stateless_normal([3, 3], [1, 2], dtype=tf.float64)
  x = tf.random.stateless_normal([4, 3], [3, 4], dtype=tf.float64)
  dy = [tf.random.stateless_normal([4, 3], [5, i], dtype=tf.float64)
        for i in range(2)]
  return w, x, dy


def _Inline(w, x, dy):
  """d x, d w by a tape over the inline cell: the reference."""
  with tf.GradientTape() as tape:
    tape.watch([w, x])
    y = _Cell([w], [x])
  pairs = [(t, d) for t, d in zip(y, dy) if d is not None]
  return tape.gradient([t for t, _ in pairs], [x, w],
                       output_gradients=[d for _, d in pairs],
                       unconnected_gradients=tf.UnconnectedGradients.ZERO)


def _Runner(split):
  """tf.function (w, x, dy) -> (d x, d w, residuals) through `split`."""

  @tf.function(autograph=False)
  def Run(w, x, dy):
    y, kept = split.Forward([w], [x])
    dx, dtheta = split.Backward([w], [x], list(kept), dy, list(y))
    return dx[0], dtheta[0], kept

  return Run


def _Split(w, x, dy):
  return _Runner(residuals.SplitCell('cell', _Cell, _Function))(w, x, dy)


def _Function(fn):
  return tf.function(fn, autograph=False,
                     experimental_attributes={'_noinline': True})


class SplitCellTest(tf.test.TestCase):

  def testGradientsBitwiseEqualInline(self):
    w, x, dy = _Values()
    dx, dw, _ = _Split(w, x, dy)
    ref_dx, ref_dw = _Inline(w, x, dy)
    self.assertAllEqual(ref_dx, dx)
    self.assertAllEqual(ref_dw, dw)

  def testOutputWithoutGradient(self):
    """dy None for an output: its gradient is left out, as inline."""
    w, x, dy = _Values()
    for missing in (0, 1):
      some = [None if i == missing else d for i, d in enumerate(dy)]
      dx, dw, _ = _Split(w, x, some)
      ref_dx, ref_dw = _Inline(w, x, some)
      self.assertAllEqual(ref_dx, dx, msg=f'dy {missing} None')
      self.assertAllEqual(ref_dw, dw, msg=f'dy {missing} None')

  def testNoOutputHasGradient(self):
    w, x, _ = _Values()
    dx, dw, _ = _Split(w, x, [None, None])
    self.assertAllEqual(tf.zeros_like(x), dx)
    self.assertAllEqual(tf.zeros_like(w), dw)

  def testBackwardKeepsInsteadOfRecomputing(self):
    """The backward runs no forward op; tanh's output is a residual."""
    w, x, dy = _Values()
    run = _Runner(residuals.SplitCell('cell', _Cell, _Function))
    _, _, kept = run(w, x, dy)
    tanh = tf.tanh(x @ w)
    self.assertTrue(any(k.shape == tanh.shape and
                        bool(tf.reduce_all(k == tanh)) for k in kept))
    library = run.get_concrete_function(w, x, dy).graph.as_graph_def().library
    backward = [f for f in library.function
                if 'cell_backward_keep_11' in f.signature.name]
    self.assertLen(backward, 1)
    types = {node.op for node in backward[0].node_def}
    self.assertIn('TanhGrad', types)
    self.assertNotIn('Tanh', types)

  def testForwardTracedOnce(self):
    """Calling the split cell for more micro-batches adds no trace."""
    w, x, dy = _Values()
    split = residuals.SplitCell('cell', _Cell, _Function)

    @tf.function(autograph=False)
    def Run(w, x, dy):
      outs = []
      for m in range(4):
        y, kept = split.Forward([w], [x + m])
        outs.append(split.Backward([w], [x + m], list(kept), dy, list(y)))
      return outs

    Run.get_concrete_function(w, x, dy)
    self.assertEqual(1, split.forward_function.experimental_get_tracing_count())


if __name__ == '__main__':
  tf.test.main()
