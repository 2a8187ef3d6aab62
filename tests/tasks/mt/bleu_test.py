"""Tests of corpus BLEU against values worked out by hand."""

import math

from absl.testing import absltest
from absl.testing import parameterized

from lingvo_pipe.tasks.mt import bleu


def _Split(text):
  return text.split()


class BleuTest(parameterized.TestCase):

  def testPerfectMatchIs100(self):
    self.assertEqual(100.0, bleu.CorpusBleu([_Split('a b c d e')],
                                            [_Split('a b c d e')]))

  def testOneWordWrong(self):
    # hyp a b c d x f, ref a b c d e f: same length, so BP = 1.
    #   1-grams 5/6 (x), 2-grams 3/5 (ab bc cd), 3-grams 2/4 (abc bcd),
    #   4-grams 1/3 (abcd): BLEU = (5/6 * 3/5 * 2/4 * 1/3)^(1/4) = 12^(-1/4)
    stats = bleu.SentenceStats(_Split('a b c d x f'), _Split('a b c d e f'))
    self.assertEqual([5, 3, 2, 1], stats.matches)
    self.assertEqual([6, 5, 4, 3], stats.totals)
    got = bleu.CorpusBleu([_Split('a b c d x f')], [_Split('a b c d e f')])
    self.assertAlmostEqual(100 * 12**-0.25, got, places=10)
    self.assertAlmostEqual(53.7284966, got, places=6)

  def testBrevityPenalty(self):
    # Every n-gram matches; c = 5 < r = 7: BP = exp(1 - 7/5).
    got = bleu.CorpusBleu([_Split('a b c d e')], [_Split('a b c d e f g')])
    self.assertAlmostEqual(100 * math.exp(-0.4), got, places=10)
    self.assertAlmostEqual(67.0320046, got, places=6)

  def testNoPenaltyWhenLonger(self):
    # hyp a..h (8), ref a..f (6): p = 6/8, 5/7, 4/6, 3/5, BP = 1.
    got = bleu.CorpusBleu([_Split('a b c d e f g h')],
                          [_Split('a b c d e f')])
    want = 100 * (6 / 8 * 5 / 7 * 4 / 6 * 3 / 5)**0.25
    self.assertAlmostEqual(want, got, places=10)

  def testCountsAreClipped(self):
    # Papineni et al.'s example: 'the' counts at most twice.
    stats = bleu.SentenceStats(_Split('the the the the the the the'),
                               _Split('the cat is on the mat'))
    self.assertEqual([2, 0, 0, 0], stats.matches)
    self.assertEqual([7, 6, 5, 4], stats.totals)
    self.assertEqual(0.0, bleu.BleuFromStats(stats))

  def testCorpusSumsCountsBeforeDividing(self):
    # Sentence 1: matches 5 3 2 1 of 6 5 4 3; sentence 2: 4 3 2 1 of 4 3 2 1.
    # Corpus: 9/10, 6/8, 4/6, 2/4 with c = r = 10.
    hyps = [_Split('a b c d x f'), _Split('a b c d')]
    refs = [_Split('a b c d e f'), _Split('a b c d')]
    got = bleu.CorpusBleu(hyps, refs)
    self.assertAlmostEqual(100 * (9 / 10 * 6 / 8 * 4 / 6 * 2 / 4)**0.25, got,
                           places=10)
    mean_of_sentences = (100 * 12**-0.25 + 100) / 2
    self.assertGreater(abs(got - mean_of_sentences), 5.0)

  @parameterized.named_parameters(
      ('empty_hypothesis', [], ['a', 'b', 'c', 'd']),
      ('shorter_than_4', ['a', 'b', 'c'], ['a', 'b', 'c']),
      ('nothing_matches', ['x', 'y', 'z', 'w'], ['a', 'b', 'c', 'd']))
  def testZero(self, hyp, ref):
    self.assertEqual(0.0, bleu.CorpusBleu([hyp], [ref]))

  def testMaxOrder2(self):
    # 1-grams 5/6, 2-grams 3/5: (1/2)^(1/2).
    got = bleu.CorpusBleu([_Split('a b c d x f')], [_Split('a b c d e f')],
                          max_order=2)
    self.assertAlmostEqual(100 * 0.5**0.5, got, places=10)

  def testIdsWork(self):
    self.assertEqual(100.0, bleu.CorpusBleu([[5, 6, 7, 8]], [[5, 6, 7, 8]]))

  def testMetricAccumulatesLikeCorpusBleu(self):
    hyps = [_Split('a b c d x f'), _Split('a b c d'), _Split('p q')]
    refs = [_Split('a b c d e f'), _Split('a b c d'), _Split('p q r s')]
    metric = bleu.CorpusBleuMetric()
    self.assertEqual(0.0, metric.value)
    for hyp, ref in zip(hyps, refs):
      metric.AddSentence(hyp, ref)
    self.assertEqual(3, metric.num_sentences)
    self.assertAlmostEqual(bleu.CorpusBleu(hyps, refs), metric.value,
                           places=12)
    value, precisions, bp = metric.Summary()
    self.assertEqual(metric.value, value)
    self.assertEqual([11 / 12, 7 / 9, 4 / 6, 2 / 4], precisions)
    self.assertAlmostEqual(math.exp(1 - 14 / 12), bp, places=12)

  def testErrors(self):
    with self.assertRaisesRegex(ValueError, '2 hypotheses but 1'):
      bleu.CorpusBleu([['a'], ['b']], [['a']])
    with self.assertRaisesRegex(ValueError, 'max_order=0'):
      bleu.SentenceStats(['a'], ['a'], max_order=0)


if __name__ == '__main__':
  absltest.main()
