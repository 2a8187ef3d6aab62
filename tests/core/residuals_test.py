"""Tests of residuals.SplitCell: the kept-activation forward and backward."""

from unittest import mock

import tensorflow as tf

from lingvo_pipe.core import backward_split
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


def _Reductions(theta_leaves, x):
  """Means and sums whose gradients each trace their own shape constants."""
  w, b = theta_leaves
  h, = x
  a = tf.reduce_mean(h @ w + b, axis=1, keepdims=True)
  c = tf.reduce_mean(tf.tanh(h) * b, axis=1, keepdims=True)
  return [a * c + tf.reduce_sum(w, axis=0)]


class SharedConstantsTest(tf.test.TestCase):
  """Equal constants of a gradient are one node of the backward body."""

  def _Run(self):
    """(d x, d w, d b) through a SplitCell, and the cell's backward."""
    w, x, dy = _Values()
    b = tf.random.stateless_normal([3], [6, 7], dtype=tf.float64)
    split = residuals.SplitCell('cell', _Reductions, _Function)

    @tf.function(autograph=False)
    def Run(w, b, x, dy):
      y, kept = split.Forward([w, b], [x])
      dx, dtheta = split.Backward([w, b], [x], list(kept), dy, list(y))
      return dx + dtheta

    grads = Run(w, b, x, dy[:1])
    backward, = split._backwards.values()  # pylint: disable=protected-access
    return grads, backward

  def _Backward(self):
    """The backward, once its gradients are checked bitwise against those
    of the same backward with every constant left as traced."""
    grads, backward = self._Run()
    with mock.patch.object(residuals, '_ShareConstants'):
      reference, unshared = self._Run()
    self.assertLess(len(backward.graph_def.node),
                    len(unshared.graph_def.node))
    for ref, value in zip(reference, grads):
      self.assertAllEqual(ref, value)
    return backward

  def testNoTwoEqualConstants(self):
    graph = self._Backward().graph_def
    values = [(n.attr['dtype'].type,
               n.attr['value'].SerializeToString(deterministic=True))
              for n in graph.node if n.op == 'Const' and not n.input]
    self.assertGreater(len(values), 3)
    self.assertLen(set(values), len(values))

  def testZeroBubbleHalvesCopyAConstantInsteadOfCarryingIt(self):
    halves = backward_split._Partition(  # pylint: disable=protected-access
        self._Backward())
    in_b = {n.name: n for n in halves.b_graph.node}
    shared = [n for n in halves.w_nodes if n.name in in_b]
    self.assertNotEmpty(shared)
    self.assertTrue(all(n.op == 'Const' for n in shared))
    carried = {name.split(':')[0] for name in halves.carry}
    self.assertEmpty([n for n in carried if in_b[n].op == 'Const'])
    self.assertNotEmpty(carried)


if __name__ == '__main__':
  tf.test.main()
