"""Tests of beam search against brute force on a hand-made decoder."""

import itertools
import math

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from lingvo_pipe.tasks.mt import beam_search
from lingvo_pipe.tasks.mt import decoder
from lingvo_pipe.tasks.mt import tokenizer

_PAD, _SOS, _EOS = tokenizer.PAD_ID, tokenizer.SOS_ID, tokenizer.EOS_ID
_V = 5  # <pad>, <s>, </s>, a, b


def _Table(seed):
  """log P(next | previous-but-one, previous): [V, V, V], no <pad>/<s>."""
  rng = np.random.default_rng(seed)
  logits = rng.normal(scale=1.5, size=[_V, _V, _V])
  logits[..., [_PAD, _SOS]] = -np.inf
  return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


def _StepFn(table, batch_offsets):
  """A decoder whose next token depends on the last two (one in the cache).

  Row r of sentence i reads table[(prev2 + offset_i) % V, last]: each
  sentence its own distribution. The cache is [n, 1] (the token before
  last), so a beam reordered without its cache would read the wrong row.
  """
  table = tf.constant(table, tf.float32)

  def Step(last, t, cache):
    del t
    prev2 = (cache[:, 0] + batch_offsets) % _V
    logp = tf.gather_nd(table, tf.stack([prev2, last], 1))
    return logp, last[:, tf.newaxis]

  return Step


def _BruteForce(table, offset, max_length, alpha):
  """(best score, its tokens) over every sequence of up to max_length."""
  best = (-math.inf, None)
  for length in range(1, max_length + 1):
    for words in itertools.product([3, 4], repeat=length - 1):
      ended = list(words) + [_EOS]
      for tokens in (ended, list(words) + [3], list(words) + [4]):
        if tokens[-1] != _EOS and length < max_length:
          continue  # unfinished: only at the length limit
        prev2, last, logp = _SOS, _SOS, 0.0
        for token in tokens:
          logp += table[(prev2 + offset) % _V, last, token]
          prev2, last = last, token
        score = logp / ((5 + length) / 6)**alpha
        if score > best[0] + 1e-9:
          best = (score, tokens)
  return best


def _Search(table, offsets, k, max_length, alpha=0.0):
  b = len(offsets)
  batch_offsets = tf.constant(np.repeat(offsets, k), tf.int32)
  cache = tf.fill([b * k, 1], _SOS)
  return beam_search.BeamSearch(_StepFn(table, batch_offsets), cache, b, k,
                                max_length, alpha)


class BeamSearchTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters((0, 0.0), (1, 0.0), (2, 0.6), (3, 1.0))
  def testWideBeamFindsTheBestSequence(self, seed, alpha):
    # A beam wider than all 3 * 2^4 extensions of a step is exhaustive: it
    # must find brute force's best sequence, for each of three sentences.
    table, offsets, t = _Table(seed), [0, 1, 3], 5
    out = _Search(table, offsets, 48, t, alpha)
    for i, offset in enumerate(offsets):
      score, tokens = _BruteForce(table, offset, t, alpha)
      n = len(tokens)
      self.assertAllEqual(tokens + [_PAD] * (t - n), out.ids[i])
      self.assertEqual(n, out.lengths[i])
      self.assertAllClose(score, out.scores[i], atol=1e-5, rtol=0)

  def testBeamOneIsGreedy(self):
    table, offsets, t = _Table(4), [0, 2], 6
    out = _Search(table, offsets, 1, t)
    table_tf = tf.constant(table, tf.float32)

    def LogitsFn(inputs):  # the same decoder, uncached, on the prefix
      prev2 = tf.concat([tf.fill([2, 1], _SOS), inputs[:, :-1]], 1)
      prev2 = (prev2 + tf.constant(offsets)[:, tf.newaxis]) % _V
      return tf.gather_nd(table_tf, tf.stack([prev2, inputs], -1))

    greedy = decoder.GreedyDecodeUncached(LogitsFn, 2, t)
    self.assertAllEqual(greedy.ids, out.ids)
    self.assertAllEqual(greedy.lengths, out.lengths)
    self.assertAllClose(greedy.scores, out.scores, atol=1e-5, rtol=0)

  def testWiderIsAtLeastAsProbable(self):
    gains = []
    for seed in range(6):  # 30 sentences
      table, offsets = _Table(seed), [0, 1, 2, 3, 4]
      scores = [_Search(table, offsets, k, 6).log_probs.numpy()
                for k in (1, 2, 4)]
      for narrow, wide in zip(scores, scores[1:]):
        self.assertTrue(np.all(wide >= narrow - 1e-6), seed)
      gains += list(scores[2] - scores[0])
    # And greedy misses the best sequence of some sentences.
    self.assertGreater(sum(g > 1e-3 for g in gains), 3)

  def testUnfinishedAtTheLimitReturnsTheBestAlive(self):
    # </s> is never likely: nothing ends within 3 tokens.
    table = np.log(np.full([_V, _V, _V], 1e-6))
    table[..., 3] = np.log(0.7)
    table[..., 4] = np.log(0.3 - 3e-6)
    out = _Search(table, [0], 2, 3, alpha=0.6)
    self.assertAllEqual([[3, 3, 3]], out.ids)
    self.assertAllEqual([3], out.lengths)
    self.assertAllClose([3 * math.log(0.7)], out.log_probs, atol=1e-5,
                        rtol=0)
    penalty = ((5 + 3) / 6)**0.6
    self.assertAllClose(out.log_probs / penalty, out.scores, atol=1e-6,
                        rtol=0)

  def testStopsEarlyAndStaticInAGraph(self):
    calls = []
    table = tf.constant(_Table(6), tf.float32)

    def Step(last, t, cache):
      calls.append(t)
      return tf.gather_nd(table, tf.stack([cache[:, 0] % _V, last], 1)), (
          last[:, tf.newaxis])

    fn = tf.function(lambda: beam_search.BeamSearch(
        Step, tf.fill([6, 1], _SOS), 2, 3, 50), autograph=False)
    out = fn()
    self.assertEqual([2, 50], out.ids.shape.as_list())
    self.assertLen(calls, 1)  # one traced body: a while loop
    self.assertTrue(np.all(out.lengths.numpy() < 50))

  def testErrors(self):
    step = _StepFn(_Table(0), tf.zeros([1], tf.int32))
    with self.assertRaisesRegex(ValueError, 'beam_size=0'):
      beam_search.BeamSearch(step, tf.zeros([1, 1], tf.int32), 1, 0, 3)
    with self.assertRaisesRegex(ValueError, 'length_alpha=-1'):
      beam_search.BeamSearch(step, tf.zeros([1, 1], tf.int32), 1, 1, 3,
                             length_alpha=-1)


if __name__ == '__main__':
  absltest.main()
