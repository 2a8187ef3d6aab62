"""Translation models train in bfloat16 (task.fprop_dtype) as in float32.

A tiny TransformerMT (mt.synthetic.TransformerTinyGPipe's recipe, K=2,
M=2) with task.fprop_dtype bfloat16 has it on every layer; its variables
and Adam's slots are float32; every floating tensor its partitions hand
each other in a traced training step (hand_offs.HandOffs), forward and
back, is bfloat16 (the int64 example keys ride along), and so in
evaluation; the loss, the metrics and the gradient norm are float32. The
same task in float32 hands off float32 and casts nothing to bfloat16.

mt.synthetic.TransformerTinyGPipe (K=2, M=4) on the synthetic pair,
_STEPS steps (half its recipe's) from the same initial weights and
batches in float32 and in bfloat16, then beam search over 200 test
sentences: both score a sacreBLEU above _MIN_BLEU (on id strings), and
bfloat16's is float32's within _BLEU_NOISE, twice float32's standard
deviation over seeds. Measured with this recipe, seeds 1-5 (initial
weights and batch order): float32 83.5-92.3 (standard deviation 3.5);
bfloat16 minus float32 of the same seed -2.0 to +3.3. (The 'tiny' pair,
300 sentences, is learnt by heart: 8-16 sacreBLEU in either dtype.)

The multilingual model (mt.synthetic.MultilingualTinyGPipe, tiny sizes)
trains one step and decodes in bfloat16.
"""

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from lingvo_pipe.core import devices

devices.SplitCpu(4)

from lingvo_pipe.core import hand_offs  # noqa: E402
from lingvo_pipe.tasks.mt import synthetic_multilingual  # noqa: E402
from lingvo_pipe.tasks.mt import synthetic_translation  # noqa: E402
from params.mt import synthetic  # noqa: E402

_STEPS = 600
_DECODED_BATCHES = 5  # of 40 sentences
_MIN_BLEU = 70.0
_BLEU_NOISE = 7.0  # 2 x 3.5 (module docstring)
_BF16 = tf.bfloat16


class _Translation(synthetic.TransformerTinyGPipe):
  WARMUP_STEPS = 100


class _Multilingual(synthetic.MultilingualTinyGPipe):
  DATASET = synthetic_multilingual.NAME + '/tiny'
  MODEL_DIM, HIDDEN_DIM, NUM_HEADS = 16, 32, 2
  NUM_ENCODER_LAYERS = NUM_DECODER_LAYERS = 1
  BATCH_SIZE = EVAL_BATCH_SIZE = 4
  NUM_MICRO_BATCHES = 2
  SHUFFLE_BUFFER_SIZE = 8


def _Recipe(cls, data_dir):
  return type(cls.__name__, (cls,), {'DATA_DIR': data_dir})()


def _Decoded(task, test_p, num_batches):
  """The decoder metrics over the first batches of test_p."""
  decode = tf.function(task.DecodeStep, autograph=False)
  metrics = task.CreateDecoderMetrics()
  for batch in test_p.Instantiate().GetDataset().take(num_batches):
    out = tf.nest.map_structure(lambda t: t.numpy(), decode(batch))
    task.PostProcessDecodeOut(out, metrics)
  return metrics


def _TrainedBleu(dtype, data_dir):
  """sacreBLEU on the test split after _STEPS steps of _Translation."""
  recipe = _Recipe(_Translation, data_dir)
  task = recipe.Task().Set(name='task', fprop_dtype=dtype).Instantiate()
  task.CreateTrainState()
  train_step = tf.function(task.TrainStep, autograph=False)
  for batch in recipe.Train().Instantiate().GetDataset().take(_STEPS):
    out = train_step(batch)
    assert bool(out.is_finite) and out.loss.dtype == tf.float32
  return _Decoded(task, recipe.Test(), _DECODED_BATCHES)['bleu'].value


class _Tiny(synthetic.TransformerTinyGPipe):
  """The registered recipe at tiny sizes, K=2, M=2."""
  MODEL_DIM, HIDDEN_DIM, NUM_HEADS = 16, 32, 2
  NUM_ENCODER_LAYERS = NUM_DECODER_LAYERS = 1
  BATCH_SIZE = EVAL_BATCH_SIZE = 4
  NUM_MICRO_BATCHES = 2
  MAX_LENGTH = 8
  SHUFFLE_BUFFER_SIZE = 8
  DATASET = synthetic_translation.NAME + '/tiny'


class StateAndHandOffsTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls._data_dir = absltest.TEST_TMPDIR.value + '/bfloat16_test_data'
    recipe = type('Tiny', (_Tiny,), {'DATA_DIR': cls._data_dir})()
    cls._task_p = recipe.Task().Set(name='task')
    cls._batch = next(iter(recipe.Train().Instantiate().GetDataset()))

  def _Task(self, dtype):
    task = self._task_p.Copy().Set(fprop_dtype=dtype).Instantiate()
    task.CreateTrainState()
    return task

  def _HandOffs(self, task, step):
    concrete = tf.function(step, autograph=False).get_concrete_function(
        self._batch)
    found = hand_offs.HandOffs(concrete.graph, task.stack.devices)
    directions = {(h.src, h.dst) for h in found}
    self.assertLen(directions, 2 if step == task.TrainStep else 1)
    return {h.tensor.dtype for h in found}

  def _MatMuls(self, task):
    """{dtype: count} of the matrix products in a traced training step,
    the functions it calls (the pipeline's stages) included."""
    graph_def = tf.function(task.TrainStep, autograph=False
                            ).get_concrete_function(self._batch
                                                    ).graph.as_graph_def()
    nodes = list(graph_def.node)
    for function in graph_def.library.function:
      nodes += function.node_def
    counts = {}
    for node in nodes:
      if node.op in ('MatMul', 'BatchMatMulV2', 'BatchMatMulV3', 'Einsum'):
        dtype = tf.as_dtype(node.attr['T'].type)
        counts[dtype] = counts.get(dtype, 0) + 1
    return counts

  def testEveryLayerComputesInBfloat16(self):
    task = self._Task(_BF16)
    for layer in task.Layers():
      self.assertEqual(_BF16, layer.fprop_dtype, layer.path)
      self.assertEqual(tf.float32, layer.params.dtype, layer.path)
    # The ops, not the attribute: every matrix product of the step,
    # forward and backward, in bfloat16; as many as in float32, where
    # every one is float32.
    bf16, f32 = self._MatMuls(task), self._MatMuls(self._Task(None))
    self.assertEqual([_BF16], list(bf16))
    self.assertEqual([tf.float32], list(f32))
    self.assertEqual(bf16[_BF16], f32[tf.float32])
    self.assertGreater(bf16[_BF16], 30)

  def testStateIsFloat32HandOffsBfloat16(self):
    task = self._Task(_BF16)
    # Activations forward, gradients back: bfloat16; the example keys of
    # the dropout masks (int64) ride along.
    self.assertEqual({_BF16, tf.int64},
                     self._HandOffs(task, task.TrainStep))
    self.assertEqual({_BF16, tf.int64},
                     self._HandOffs(task, task.EvalStep))
    # Variables, Adam's slots (its step and global_step count in int64).
    state = task.VariablesToCheckpoint()
    self.assertContainsSubset(task.train_state.optimizer.SlotVariables(),
                              state)
    for name, var in state.items():
      want = tf.int64 if name.endswith('step') else tf.float32
      self.assertEqual(want, var.dtype, name)
    out = tf.function(task.TrainStep, autograph=False)(self._batch)
    self.assertTrue(bool(out.is_finite))
    for name in ('loss', 'log_pplx', 'token_accuracy', 'grad_norm'):
      self.assertEqual(tf.float32, out[name].dtype, name)
    metrics = tf.function(task.EvalStep, autograph=False)(self._batch)
    self.assertEqual(tf.float32, metrics.loss[0].dtype)

  def testFloat32TaskHandsOffFloat32(self):
    task = self._Task(None)
    self.assertEqual({tf.float32, tf.int64},
                     self._HandOffs(task, task.TrainStep))
    ops = tf.function(task.TrainStep, autograph=False).get_concrete_function(
        self._batch).graph.get_operations()
    casts = [op for op in ops
             if op.type == 'Cast' and op.get_attr('DstT') == _BF16]
    self.assertEmpty(casts)


class TrainingTest(tf.test.TestCase):

  def testTransformerTinyTranslatesAsInFloat32(self):
    data_dir = self.create_tempdir().full_path
    want = _TrainedBleu(None, data_dir)
    got = _TrainedBleu(tf.bfloat16, data_dir)
    self.assertGreater(want, _MIN_BLEU)
    self.assertGreater(got, _MIN_BLEU)
    self.assertLessEqual(abs(got - want), _BLEU_NOISE)

  def testMultilingualTrainsAndDecodes(self):
    recipe = _Recipe(_Multilingual, self.create_tempdir().full_path)
    task = recipe.Task().Set(name='task', fprop_dtype=tf.bfloat16)
    task = task.Instantiate()
    self.assertEqual(tf.bfloat16, task.stack.hand_off_dtype)
    task.CreateTrainState()
    batch = next(iter(recipe.Train().Instantiate().GetDataset()))
    out = tf.function(task.TrainStep, autograph=False)(batch)
    self.assertTrue(bool(out.is_finite))
    self.assertEqual(tf.float32, out.loss.dtype)
    decoded = task.DecodeStep(batch)
    self.assertEqual(tf.float32, decoded.scores.dtype)
    self.assertTrue(np.all(np.isfinite(decoded.scores.numpy())))


if __name__ == '__main__':
  absltest.main()
