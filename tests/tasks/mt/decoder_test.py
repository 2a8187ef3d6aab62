"""Tests of greedy decoding: a hand-made decoder, then a trained model."""

import math

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from lingvo_pipe.core import devices

devices.SplitCpu(4)

from lingvo_pipe.core import lr_schedule  # noqa: E402
from lingvo_pipe.core import optimizer  # noqa: E402
from lingvo_pipe.core.nested_map import NestedMap  # noqa: E402
from lingvo_pipe.tasks.mt import decoder  # noqa: E402
from lingvo_pipe.tasks.mt import model  # noqa: E402
from lingvo_pipe.tasks.mt import tokenizer  # noqa: E402
from lingvo_pipe.tasks.mt import transformer  # noqa: E402

_EOS, _SOS, _PAD = tokenizer.EOS_ID, tokenizer.SOS_ID, tokenizer.PAD_ID
_V = 12
# Row b counts up from _START[b]; the token after _LAST[b] is </s>.
_START = [4, 6, 9]
_LAST = [6, 11, 9]
_SHARP = 10.0  # logit of the chosen token; the others are 0


class Counter:
  """A causal 'decoder': the token after x is x + 1 (row's start after <s>).

  logits[b, i] depends on inputs[b, i] only. Records every call's inputs.
  """

  def __init__(self):
    self.calls = []

  def __call__(self, inputs):
    self.calls.append(inputs)
    start = tf.constant(_START)[:, None]
    last = tf.constant(_LAST)[:, None]
    nxt = tf.where(tf.equal(inputs, _SOS), start, inputs + 1)
    nxt = tf.where(nxt > last, _EOS, nxt)
    return _SHARP * tf.one_hot(nxt, _V, dtype=tf.float64)


def _Expected(max_length):
  rows = []
  for start, last in zip(_START, _LAST):
    row = list(range(start, last + 1)) + [_EOS]
    row = row[:max_length]
    rows.append(row + [_PAD] * (max_length - len(row)))
  return np.array(rows)


class GreedyDecodeTest(tf.test.TestCase, parameterized.TestCase):

  def testDecodesTheCounterAndStopsWhenAllRowsEnd(self):
    counter = Counter()
    out = decoder.GreedyDecodeUncached(counter, 3, 10)
    self.assertAllEqual(_Expected(10), out.ids)
    self.assertAllEqual([4, 7, 2], out.lengths)
    # Row 1 emits </s> at step 6: 7 calls, not 10.
    self.assertLen(counter.calls, 7)
    # Call i sees <s> and the first i decoded tokens, padding after them.
    for i, inputs in enumerate(counter.calls):
      want = np.concatenate([np.full([3, 1], _SOS), _Expected(10)[:, :i],
                             np.full([3, 10 - i - 1], _PAD)], 1)
      self.assertAllEqual(want, inputs, msg=f'call {i}')
    step_logp = _SHARP - math.log(math.exp(_SHARP) + _V - 1)
    self.assertAllClose(np.array([4, 7, 2]) * step_logp, out.scores)

  def testTruncatesAtMaxLength(self):
    out = decoder.GreedyDecodeUncached(Counter(), 3, 5)
    self.assertAllEqual(_Expected(5), out.ids)  # Row 1 has no </s>.
    self.assertAllEqual([4, 5, 2], out.lengths)

  def testSameInAGraphWithStaticShapes(self):
    fn = tf.function(lambda: decoder.GreedyDecodeUncached(Counter(), 3, 10),
                     autograph=False)
    out = fn()
    self.assertAllEqual(_Expected(10), out.ids)
    spec = fn.get_concrete_function().structured_outputs
    self.assertEqual([3, 10], spec.ids.shape)
    self.assertEqual([3], spec.lengths.shape)
    self.assertEqual([3], spec.scores.shape)

  def testBadMaxLength(self):
    with self.assertRaisesRegex(ValueError, 'max_length=0'):
      decoder.GreedyDecodeUncached(Counter(), 3, 0)

  @parameterized.parameters(
      ([5, 6, 2, 7, 0], [5, 6]),
      ([1, 5, 0, 6, 2], [5, 6]),
      ([2, 5], []),
      ([5, 6, 7], [5, 6, 7]))
  def testTrimIds(self, ids, want):
    self.assertEqual(want, decoder.TrimIds(np.array(ids)))


def _CopyBatch(rng, batch_size, length, vocab):
  """src = w1 .. wn </s>, target = the same words: a copy task."""
  words = rng.integers(4, vocab, [batch_size, length])
  eos = np.full([batch_size, 1], _EOS)
  sos = np.full([batch_size, 1], _SOS)
  src = np.concatenate([words, eos], 1).astype(np.int32)
  zeros = tf.zeros(src.shape)
  return NestedMap(
      src=NestedMap(ids=tf.constant(src), paddings=zeros),
      tgt=NestedMap(ids=tf.constant(np.concatenate([sos, words], 1),
                                    tf.int32),
                    labels=tf.constant(src), paddings=zeros))


class TrainedModelTest(tf.test.TestCase):

  def testLearnsToCopyThenDecodesTheCopy(self):
    # 200 Adam steps (about 0.05 s each) learn to copy 4 words out of 6.
    vocab, length, dim = 10, 4, 32
    layers = transformer.TransformerLayers(1, 1, dim, 2 * dim, 2)
    p = model.TransformerMT.Params().Set(
        name='mt', src_vocab_size=vocab, tgt_vocab_size=vocab,
        model_dim=dim, stack=transformer.SequentialStack(layers),
        label_smoothing=0.0, random_seed=3)
    p.train.optimizer = optimizer.Adam.Params()
    p.train.learning_rate = 0.005
    p.train.lr_schedule = lr_schedule.Piecewise.Params().Set(
        boundaries=[150], values=[1.0, 0.1])
    task = p.Instantiate()
    task.CreateTrainState()
    step = tf.function(task.TrainStep, autograph=False)
    rng = np.random.default_rng(0)
    first = step(_CopyBatch(rng, 32, length, vocab))
    for _ in range(199):
      out = step(_CopyBatch(rng, 32, length, vocab))
    self.assertLess(float(first.token_accuracy), 0.5)
    self.assertGreater(float(out.token_accuracy), 0.99)
    test = _CopyBatch(np.random.default_rng(1), 16, length, vocab)
    decoded = tf.function(task.DecodeStep, autograph=False)(test)
    self.assertAllEqual(test.src.ids, decoded.hyp_ids)  # words, then </s>
    self.assertAllEqual(np.full([16], length + 1), decoded.hyp_lengths)
    metrics = task.CreateDecoderMetrics()
    task.PostProcessDecodeOut(
        tf.nest.map_structure(lambda t: t.numpy(), decoded), metrics)
    self.assertAlmostEqual(100.0, metrics['bleu'].value, places=9)
    self.assertEqual(1.0, metrics['exact_match'].value)


if __name__ == '__main__':
  absltest.main()
