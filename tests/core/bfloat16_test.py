"""fprop_dtype bfloat16: float32 state, bfloat16 compute and hand-offs.

Layers: layer norm and batch norm reduce in float32 (every Mean and Sum
op of their graphs); batch norm's accumulators and moving averages are
those of the same inputs in float32, bitwise; softmax cross-entropy of
bfloat16 logits is float32. A pipeline (K=2, M=2, one pass): with
fprop_dtype bfloat16 every tensor its partitions hand each other in the
traced step (hand_offs.HandOffs) is bfloat16, forward and back, half
float32's bytes; the loss and every gradient are float32. Without it the
hand-offs are float32 and the step has no Cast at all. A whole bfloat16
model's state and hand-offs: tests/tasks/mt/mt_bfloat16_test.py.
"""

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from lingvo_pipe.core import devices

devices.SplitCpu(4)

from lingvo_pipe.core import base_layer  # noqa: E402
from lingvo_pipe.core import gpipe  # noqa: E402
from lingvo_pipe.core import layers  # noqa: E402
from lingvo_pipe.core import normalization  # noqa: E402
from lingvo_pipe.core import hand_offs  # noqa: E402
from lingvo_pipe.core.nested_map import NestedMap  # noqa: E402

_BF16 = tf.bfloat16


def _Traced(fn, *args):
  """(concrete function of fn over args, its graph's ops)."""
  concrete = tf.function(fn, autograph=False).get_concrete_function(*args)
  return concrete, concrete.graph.get_operations()


def _ReductionDtypes(ops):
  return {op.get_attr('T') for op in ops if op.type in ('Mean', 'Sum')}


class LayersTest(tf.test.TestCase):

  def testLayerNormReducesInFloat32(self):
    ln = normalization.LayerNorm.Params().Set(
        name='ln', input_dim=16, fprop_dtype=_BF16).Instantiate()
    x = tf.cast(100.0 + tf.random.stateless_normal([4, 16], [1, 2]), _BF16)
    fn, ops = _Traced(ln.FPropDefaultTheta, x)
    self.assertEqual({tf.float32}, _ReductionDtypes(ops))
    y = fn(x)
    self.assertEqual(_BF16, y.dtype)
    want = ln.FPropDefaultTheta(tf.cast(x, tf.float32))
    self.assertAllClose(want, tf.cast(y, tf.float32), atol=2**-7, rtol=2**-7)

  def testLayerNormGradientIsFloat32s(self):
    ln = normalization.LayerNorm.Params().Set(
        name='ln', input_dim=16, fprop_dtype=_BF16).Instantiate()
    x = tf.cast(tf.random.stateless_normal([4, 16], [5, 6]), _BF16)
    dy = tf.random.stateless_normal([4, 16], [7, 8])

    def Grads(inputs):
      with tf.GradientTape() as tape:
        tape.watch(inputs)
        y = ln.FPropDefaultTheta(inputs)
      return tape.gradient(y, [inputs] + ln.vars.Flatten(),
                           output_gradients=tf.cast(dy, y.dtype))

    got, want = Grads(x), Grads(tf.cast(x, tf.float32))
    self.assertEqual(_BF16, got[0].dtype)
    for g, w in zip(got, want):
      self.assertAllClose(w, tf.cast(g, tf.float32), atol=0.02, rtol=0.01)

  def testBatchNormStatisticsAreFloat32(self):
    def Bn():
      return normalization.BatchNormLayer.Params().Set(
          name='bn', dim=8, fprop_dtype=_BF16).Instantiate()
    bn, reference = Bn(), Bn()
    x = tf.cast(3.0 + tf.random.stateless_normal([4, 5, 8], [3, 4]), _BF16)
    fn, ops = _Traced(bn.FPropDefaultTheta, x)
    self.assertEqual({tf.float32}, _ReductionDtypes(ops))
    y = fn(x)
    want = reference.FPropDefaultTheta(tf.cast(x, tf.float32))
    self.assertEqual(_BF16, y.dtype)
    self.assertAllClose(want, tf.cast(y, tf.float32), atol=2**-7, rtol=2**-7)
    for layer in (bn, reference):
      layer.UpdateStats()
    for name, var in bn.vars.items():
      self.assertEqual(tf.float32, var.dtype, name)
      self.assertAllEqual(reference.vars[name], var)
    self.assertNotAllEqual(np.zeros(8), bn.vars.moving_mean)

  def testSoftmaxCrossEntropyIsFloat32(self):
    logits = tf.cast(tf.random.stateless_normal([4, 10], [5, 6]), _BF16)
    xent = layers.SoftmaxCrossEntropy(logits, class_ids=tf.range(4))
    for name in ('log_probs', 'per_example_loss', 'avg_loss'):
      self.assertEqual(tf.float32, xent[name].dtype, name)


def _Bytes(hand_offs):
  return sum(h.tensor.shape.num_elements() * h.tensor.dtype.size
             for h in hand_offs)


def _HeadLoss(head_theta, out, batch):
  del head_theta, batch
  y = base_layer.AtLeastFloat32(out)
  return {'loss': (tf.reduce_mean(tf.square(y)), tf.constant(2.0))}


class PipelineTest(tf.test.TestCase):

  def _Step(self, dtype):
    """(traced one-pass step x -> (loss, d x, d vars), pipeline)."""
    cells = [layers.SequentialLayer.Params().Set(sub=[
        layers.ProjectionLayer.Params().Set(
            name=f'proj{i}', input_dim=8, output_dim=8, activation='RELU'),
        normalization.LayerNorm.Params().Set(name=f'ln{i}', input_dim=8)])
             for i in range(2)]
    pipe = gpipe.PipeliningLayer.Params().Set(
        name='pipe', cell_tpl=cells, num_micro_batches=2,
        devices=['/device:CPU:0', '/device:CPU:1'],
        fprop_dtype=dtype).Instantiate()
    variables = pipe.vars.Flatten()

    def Step(x):
      with tf.GradientTape() as tape:
        tape.watch(x)
        loss = pipe.FPropWithLoss(pipe.theta, x, _HeadLoss, NestedMap(),
                                  NestedMap(), 4.0).loss[0]
      return loss, tape.gradient(loss, [x] + variables)

    x = tf.random.stateless_normal([4, 8], [7, 8])
    return _Traced(Step, x), x, pipe

  def testBfloat16HandOffsFloat32Gradients(self):
    (fn, _), x, pipe = self._Step(_BF16)
    found = hand_offs.HandOffs(fn.graph, pipe.devices)
    self.assertEqual({_BF16}, {h.tensor.dtype for h in found})
    self.assertLen({(h.src, h.dst) for h in found}, 2)  # forward and back
    # Each micro-batch's [2, 8] activation forward and its gradient back:
    # half of float32's bytes.
    (fn32, _), _, pipe32 = self._Step(None)
    self.assertEqual(2 * 2 * (2 * 8) * 2, _Bytes(found))
    self.assertEqual(2 * _Bytes(found), _Bytes(
        hand_offs.HandOffs(fn32.graph, pipe32.devices)))
    loss, grads = fn(x)
    self.assertEqual(tf.float32, loss.dtype)
    for grad in grads:
      self.assertEqual(tf.float32, grad.dtype)
    for var in pipe.vars.Flatten():
      self.assertEqual(tf.float32, var.dtype)

  def testFloat32HandOffsAreFloat32(self):
    (fn, ops), _, pipe = self._Step(None)
    found = hand_offs.HandOffs(fn.graph, pipe.devices)
    self.assertEqual({tf.float32}, {h.tensor.dtype for h in found})
    self.assertEmpty([op for op in ops if op.type == 'Cast'])


if __name__ == '__main__':
  absltest.main()
