"""Length buckets: MTInput's bucketed batches, and the pipeline on each
bucket's shape against the unpipelined model (every schedule)."""

import os
import re
import shutil
import tempfile

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl.testing import absltest  # noqa: E402
from absl.testing import parameterized  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_datasets as tfds  # noqa: E402

from lingvo_pipe.core import base_input_generator  # noqa: E402
from lingvo_pipe.core import devices  # noqa: E402

devices.SplitCpu(4)

from lingvo_pipe.core import dropout  # noqa: E402
from lingvo_pipe.core import optimizer  # noqa: E402
from lingvo_pipe.core.nested_map import NestedMap  # noqa: E402
from lingvo_pipe.core.schedules import registry  # noqa: E402
from lingvo_pipe.tasks.mt import input_generator  # noqa: E402
from lingvo_pipe.tasks.mt import model  # noqa: E402
from lingvo_pipe.tasks.mt import synthetic_translation as st  # noqa: E402
from lingvo_pipe.tasks.mt import tokenizer  # noqa: E402
from lingvo_pipe.tasks.mt import transformer  # noqa: E402

_TINY = st.NAME + '/tiny'
_BOUNDS, _LIMITS = [6, 9, 13], [6, 4, 2]


def _Params(data_dir, **kwargs):
  p = input_generator.MTInput.Params().Set(
      name='mt', dataset_name=_TINY, data_dir=data_dir, batch_size=10,
      max_length=14, seed=2, bucket_upper_bound=_BOUNDS,
      bucket_batch_limit=_LIMITS)
  return p.Set(**kwargs)


def _Batches(inp):
  return [b.Transform(lambda t: t.numpy()) for b in inp.GetDataset()]


class BucketedInputTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.data_dir = tempfile.mkdtemp()
    cls.inp = _Params(cls.data_dir).Instantiate()
    cls.batches = _Batches(cls.inp)
    dataset = tfds.load(_TINY, split='train', data_dir=cls.data_dir,
                        download=False)
    cls.raw = [(ex['src'].decode(), ex['tgt'].decode())
               for ex in dataset.as_numpy_iterator()]

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.data_dir, ignore_errors=True)
    super().tearDownClass()

  def _Length(self, pair):
    return max(len(pair[0].split()), len(pair[1].split())) + 1

  def _Pairs(self, tok, b):
    return list(zip(
        [s.decode() for s in tok.Decode(b.src.ids).numpy()],
        [s.decode() for s in tok.Decode(b.tgt.labels).numpy()]))

  def _CheckBatch(self, b):
    """One bucket's batch: its limit of rows, each pair (or filler row)
    padded to the bound in Lingvo's layout. Returns the real rows."""
    n, t = b.src.ids.shape
    self.assertIn(t, _BOUNDS)
    i = _BOUNDS.index(t)
    self.assertEqual(n, _LIMITS[i])
    for path, leaf in b.FlattenItems():
      if path not in ('dropped_long', 'index'):
        self.assertEqual(leaf.shape, (n, t), path)
    real = b.index >= 0 if 'index' in b else np.ones(n, bool)
    src_len = (b.src.paddings == 0).sum(1)
    tgt_len = (b.tgt.paddings == 0).sum(1)
    longer = np.maximum(src_len, tgt_len)
    # The first bucket that holds the pair: longer than the one before.
    self.assertTrue(np.all(longer[real] <= t))
    self.assertTrue(np.all(longer[real] > (_BOUNDS[i - 1] if i else 0)))
    for row in range(n):
      m, k = src_len[row], tgt_len[row]
      if not real[row]:  # a filler: nothing but padding
        self.assertEqual(m + k, 0)
        self.assertAllEqual(b.src.ids[row], np.zeros(t))
        self.assertAllEqual(b.tgt.labels[row], np.zeros(t))
        self.assertAllEqual(b.tgt.weights[row], np.zeros(t))
        continue
      self.assertEqual(b.src.ids[row, m - 1], tokenizer.EOS_ID)
      self.assertAllEqual(b.src.ids[row, m:], np.zeros(t - m))
      self.assertAllEqual(b.src.paddings[row], np.arange(t) >= m)
      self.assertEqual(b.tgt.ids[row, 0], tokenizer.SOS_ID)
      self.assertEqual(b.tgt.labels[row, k - 1], tokenizer.EOS_ID)
      self.assertAllEqual(b.tgt.ids[row, 1:k], b.tgt.labels[row, :k - 1])
      self.assertAllEqual(b.tgt.labels[row, k:], np.zeros(t - k))
      self.assertAllEqual(b.tgt.weights[row], 1.0 - b.tgt.paddings[row])
    return real

  def testASplitReadOnceHasEveryPairOnceInItsOrder(self):
    """Evaluation and decoding: each bucket's last batch filled up with
    padding rows, `index` the pair's place in the split."""
    tok = self.inp.tokenizer
    where = {pair: i for i, pair in enumerate(self.raw)}
    got, seen = [], set()
    for b in self.batches:
      real = self._CheckBatch(b)
      seen.add(b.src.ids.shape[1])
      for pair, index, keep in zip(self._Pairs(tok, b), b.index, real):
        if keep:
          self.assertEqual(index, where[pair], pair)  # whole, in its place
          got.append(pair)
        else:
          self.assertEqual(index, -1)
    self.assertEqual(seen, set(_BOUNDS))
    kept = [pair for pair in self.raw if self._Length(pair) <= _BOUNDS[-1]]
    self.assertEqual(sorted(got), sorted(kept))
    self.assertLess(sum(map(self._Length, got)) / len(got), _BOUNDS[-1])

  def testTrainingBatchesAreFullAndUnindexed(self):
    inp = _Params(self.data_dir, repeat=True,
                  shuffle_buffer_size=64).Instantiate()
    seen = set()
    for b in inp.GetDataset().take(120):
      b = b.Transform(lambda t: t.numpy())
      self.assertNotIn('index', b)
      self.assertTrue(np.all(self._CheckBatch(b)))
      self.assertTrue(np.all((b.tgt.weights.sum(1) > 0)))
      seen.add(b.src.ids.shape[1])
    self.assertEqual(seen, set(_BOUNDS))

  def testLongPairsDroppedAndCounted(self):
    inp = _Params(self.data_dir, bucket_upper_bound=[5, 8],
                  bucket_batch_limit=[3, 2]).Instantiate()
    long = [self._Length(pair) > 8 for pair in self.raw]
    self.assertGreater(sum(long), 0)
    rows = 0
    for b in _Batches(inp):
      self.assertLessEqual(b.src.ids.shape[1], 8)
      for index, count in zip(b.index, b.dropped_long):
        # Each pair carries the count of long pairs before it.
        if index >= 0:
          self.assertEqual(count, sum(long[:index]), index)
          rows += 1
    self.assertEqual(rows, len(self.raw) - sum(long))

  def testLongPairIsAnErrorWhenAsked(self):
    inp = _Params(self.data_dir, bucket_upper_bound=[5, 8],
                  bucket_batch_limit=[3, 2],
                  long_sentences='error').Instantiate()
    with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                input_generator.LONG_PAIR_ERROR):
      _Batches(inp)

  def testWithoutBucketsEveryBatchIsPaddedToMaxLength(self):
    p = _Params(self.data_dir, bucket_upper_bound=[], bucket_batch_limit=[])
    inp = p.Instantiate()
    spec = inp.InputBatchSpec()
    self.assertNotIn('dropped_long', spec)
    self.assertEqual(spec.src.ids.shape, [10, 14])
    # Each shape traced as it comes: every axis known.
    self.assertIsNone(base_input_generator.StepSpec(p, inp.GetDataset()))

  def testOneStepSpecForEveryBucket(self):
    spec = base_input_generator.StepSpec(self.inp.params,
                                         self.inp.GetDataset())
    self.assertNotIn('dropped_long', spec)  # the model does not see it
    for path, leaf in spec.FlattenItems():
      self.assertEqual(leaf.shape.as_list(),
                       [None] if path == 'index' else [None, None], path)

  def testTokensPerBatch(self):
    self.assertEqual(input_generator.TokensPerBatch([8, 16, 64], 512, 4),
                     [64, 32, 8])
    self.assertEqual(input_generator.TokensPerBatch([10, 98], 400, 4),
                     [40, 4])  # 400 // 98 = 4; never below one multiple
    self.assertEqual(input_generator.TokensPerBatch([10, 99], 300, 8),
                     [24, 8])
    with self.assertRaisesRegex(ValueError, 'positive integers'):
      input_generator.TokensPerBatch([8], 512, 0)

  def testParamErrors(self):
    for kwargs, message in [
        (dict(bucket_batch_limit=[4, 2]), '3 bounds and .* 2 limits'),
        (dict(bucket_upper_bound=[6, 6, 13]), 'increasing'),
        (dict(bucket_batch_limit=[4, 0, 2]), 'ints >= 1'),
        (dict(long_sentences='truncate'), "one of \\('drop', 'error'\\)")]:
      with self.assertRaisesRegex(ValueError, message):
        _Params(self.data_dir, **kwargs).Instantiate()


# ---- the pipeline on each bucket's shape ------------------------------

_D, _V = 8, 12
_TOL = dict(atol=1e-12, rtol=1e-12)
# (batch, source length, target length) of two buckets' batches: many
# short pairs, a few long ones.
_SHAPES = [(8, 4, 3), (2, 12, 11)]


def _Layers():
  return transformer.TransformerLayers(1, 1, _D, 2 * _D, 2,
                                       dropout_prob=0.1,
                                       atten_dropout_prob=0.1,
                                       relu_dropout_prob=0.1)


def _Task(stack):
  return model.TransformerMT.Params().Set(
      name='mt', src_vocab_size=_V, tgt_vocab_size=_V, model_dim=_D,
      stack=stack, input_dropout_prob=0.1, label_smoothing=0.1,
      dtype=tf.float64, random_seed=3).Instantiate()


def _Batch(b, s, t, seed):
  """b random pairs padded to s and t, lengths from 2 to the bound."""
  rng = np.random.default_rng(seed)
  src = np.zeros([b, s], np.int32)
  ids = np.zeros([b, t], np.int32)
  labels = np.zeros([b, t], np.int32)
  for row in range(b):
    n, m = rng.integers(2, s + 1), rng.integers(2, t + 1)
    src[row, :n] = list(rng.integers(4, _V, n - 1)) + [tokenizer.EOS_ID]
    words = list(rng.integers(4, _V, m - 1))
    ids[row, :m] = [tokenizer.SOS_ID] + words
    labels[row, :m] = words + [tokenizer.EOS_ID]
  pad = lambda x: (x == 0).astype(np.float32)  # noqa: E731
  batch = NestedMap(
      src=NestedMap(ids=tf.constant(src), paddings=tf.constant(pad(src))),
      tgt=NestedMap(ids=tf.constant(ids), labels=tf.constant(labels),
                    paddings=tf.constant(pad(labels))))
  batch.example_keys = dropout.ExampleKeys(7, b)
  return batch


def _AnyBucket(batch):
  """The spec of `batch` with its batch and time axes unknown: what the
  trainer traces a bucketed input's step for, once for every bucket
  (base_input_generator.StepSpec)."""
  return tf.nest.map_structure(
      lambda x: tf.TensorSpec([None] * min(x.shape.rank, 2) +
                              x.shape[2:].as_list(), x.dtype), batch)


def _PlainLossAndGrads(task, batch):
  variables = dict(task.VariablesByPath())
  names = sorted(variables)
  with tf.GradientTape() as tape:
    metrics, _ = task.FProp(task.theta, batch)
  grads = tape.gradient(metrics['loss'][0], [variables[n] for n in names])
  return metrics, dict(zip(names, grads))


def _Schedules():
  """(name, V, recompute) of every registered schedule on K=2 devices, M=2:
  V=1 where it runs, and re-computing where it may."""
  out = []
  for name in registry.Names():
    for v, recompute in [(1, 'always'), (1, 'never'), (2, 'always'),
                         (2, 'never')]:
      try:
        registry.Check(name, 2 * v, 2, v, recompute, False)
      except ValueError:
        continue
      out.append((name, v, recompute))
      break
  return out


class BucketedPipelineTest(tf.test.TestCase, parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    plain = _Task(transformer.SequentialStack(_Layers()))
    cls.batches = [_Batch(*shape, seed=i) for i, shape in enumerate(_SHAPES)]
    cls.want = [_PlainLossAndGrads(plain, b) for b in cls.batches]

  @parameterized.named_parameters(*[(s[0], *s) for s in _Schedules()])
  def testEachBucketGivesTheUnpipelinedLossAndEveryGradient(
      self, name, v, recompute):
    stack = transformer.PipelinedStack(_Layers(), 2 * v, 2)
    stack.Set(schedule=name, num_virtual_stages=v, recompute=recompute)
    piped = _Task(stack)
    step = tf.function(piped.Gradients, autograph=False,
                       input_signature=[_AnyBucket(self.batches[0])])
    for batch, (want_metrics, want_grads) in zip(self.batches, self.want):
      metrics, grads = step(batch)
      where = f'{name}, batch {batch.src.ids.shape}'
      for key, (value, weight) in want_metrics.items():
        self.assertAllClose(value, metrics[key][0], **_TOL, msg=where)
        self.assertAllClose(weight, metrics[key][1], **_TOL, msg=where)
      grads = {re.sub(r'/cell_\d+/', '/', n): g for n, g in grads.items()}
      self.assertEqual(sorted(want_grads), sorted(grads))
      for key, want in want_grads.items():
        self.assertAllClose(want, grads[key], **_TOL, msg=f'{where}: {key}')
    # One trace for every bucket's shape.
    self.assertEqual(step.experimental_get_tracing_count(), 1)


def _PadTo(batch, s, t):
  """`batch` padded to source length s and target length t."""
  def Pad(x, n, value):
    return tf.pad(x, [[0, 0], [0, n - x.shape[1]]], constant_values=value)
  return NestedMap(
      src=NestedMap(ids=Pad(batch.src.ids, s, 0),
                    paddings=Pad(batch.src.paddings, s, 1.0)),
      tgt=NestedMap(ids=Pad(batch.tgt.ids, t, 0),
                    labels=Pad(batch.tgt.labels, t, 0),
                    paddings=Pad(batch.tgt.paddings, t, 1.0)))


class BucketedTrainingTest(tf.test.TestCase):

  def testBucketedStepsReachThePaddedRunsVariables(self):
    """The same pairs in the same batches and order, at each bucket's shape
    and padded to the longest: the same objective, so after four steps
    the same variables within float32 rounding (dropout off: its masks
    follow the padded shape)."""
    shapes = [(8, 4, 3), (2, 12, 11), (4, 7, 8), (8, 4, 3)]
    batches = []
    for i, shape in enumerate(shapes):
      batch = _Batch(*shape, seed=20 + i)
      del batch['example_keys']  # TrainStep makes the step's own
      batches.append(batch)

    def Train(batches, spec=None):
      layers = transformer.TransformerLayers(1, 1, _D, 2 * _D, 2)
      p = model.TransformerMT.Params().Set(
          name='mt', src_vocab_size=_V, tgt_vocab_size=_V, model_dim=_D,
          stack=transformer.PipelinedStack(layers, 2, 2),
          label_smoothing=0.1, random_seed=3)
      # SGD: the key projections' biases have a gradient of exactly zero
      # (softmax ignores a constant added to a query's every logit); Adam
      # would scale each run's rounding noise there up to a full step.
      p.train.optimizer = optimizer.SGD.Params()
      p.train.learning_rate = 0.5
      task = p.Instantiate()
      task.CreateTrainState()
      start = {n: v.numpy() for n, v in task.VariablesByPath().items()}
      step = tf.function(task.TrainStep, autograph=False,
                         input_signature=spec and [spec])
      losses = [float(step(b)['loss']) for b in batches]
      return losses, start, {n: v.numpy()
                             for n, v in task.VariablesByPath().items()}

    # Bucketed: one trace for every shape, as the trainer does.
    losses, start, got = Train(batches, _AnyBucket(batches[0]))
    want_losses, _, want = Train([_PadTo(b, 12, 12) for b in batches])
    self.assertAllClose(want_losses, losses, rtol=1e-5)
    self.assertEqual(sorted(want), sorted(got))
    for name, value in want.items():
      if not name.endswith('b_key'):
        self.assertGreater(np.abs(value - start[name]).max(), 1e-4, name)
      self.assertAllClose(value, got[name], atol=1e-5, rtol=1e-5, msg=name)


class BucketedDecodeTest(tf.test.TestCase):

  def testAPairDecodesInItsBucketAsPaddedToTheLongest(self):
    p = _Task(transformer.SequentialStack(_Layers())).params.Copy()
    p.max_decode_length = 12
    task = p.Instantiate()
    decode = tf.function(task.DecodeStep, autograph=False)
    for shape, seed in ((8, 4, 3), 30), ((2, 12, 11), 31):
      batch = _Batch(*shape, seed=seed)
      del batch['example_keys']
      got = decode(batch)
      want = decode(_PadTo(batch, 12, 12))
      self.assertAllEqual(want.hyp_ids, got.hyp_ids)
      self.assertAllClose(want.scores, got.scores, atol=1e-12, rtol=1e-12)

  def testTextsAreWrittenInTheSplitsOrderWithoutFillers(self):
    task = _Task(transformer.SequentialStack(_Layers()))
    eos = tokenizer.EOS_ID
    rows = {0: [5, 6, eos], 1: [7, eos, 0], 2: [8, 9, eos]}

    def Out(indices):
      ids = np.array([rows.get(i, [0, 0, 0]) for i in indices], np.int32)
      return {'hyp_ids': ids, 'ref_ids': ids, 'src_ids': ids,
              'index': np.array(indices, np.int64)}

    metrics = task.CreateDecoderMetrics()
    # Decoded bucket by bucket: [2, 0, filler], then [1, filler].
    task.PostProcessDecodeOut(Out([2, 0, -1]), metrics)
    task.PostProcessDecodeOut(Out([1, -1]), metrics)
    self.assertEqual(metrics['bleu'].total_weight, 3)
    self.assertEqual(metrics['exact_match'].value, 1.0)
    prefix = os.path.join(self.create_tempdir().full_path, 'out')
    task.DecodeFinalize(metrics, prefix)
    with open(prefix + '.hyp.txt') as f:
      self.assertEqual(f.read().splitlines(), ['5 6', '7', '8 9'])


if __name__ == '__main__':
  absltest.main()
