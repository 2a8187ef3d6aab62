"""Tests of SacreBleuMetric: it is sacreBLEU's corpus BLEU, on text."""

from absl.testing import absltest
import sacrebleu

from lingvo_pipe.tasks.mt import bleu

_HYPS = ['The cat sat on the mat.', 'A dog, barking loudly, ran home!',
         'Nothing matches here']
_REFS = ['The cat sat on the mat.', 'The dog, barking, ran home!',
         'All different words']


class SacreBleuMetricTest(absltest.TestCase):

  def testIsSacreBleusCorpusScore(self):
    metric = bleu.SacreBleuMetric()
    for hyp, ref in zip(_HYPS, _REFS):
      metric.Add(hyp, ref)
    want = sacrebleu.corpus_bleu(_HYPS, [_REFS])
    self.assertEqual(want.score, metric.value)
    self.assertEqual(3, metric.total_weight)
    self.assertEqual(([''] * 3, _HYPS, _REFS), metric.Texts())
    self.assertBetween(metric.value, 1.0, 99.0)

  def testPunctuationIsTokenisedNotGlued(self):
    # 13a splits 'mat.' into 'mat' '.': a perfect text match is 100, and a
    # hypothesis without the final period still matches 'mat'.
    metric = bleu.SacreBleuMetric()
    metric.Add('the cat sat on the mat.', 'the cat sat on the mat.')
    self.assertAlmostEqual(100.0, metric.value, places=9)
    glued = bleu.SacreBleuMetric(tokenize='none')
    glued.Add('the cat sat on the mat', 'the cat sat on the mat.')
    split = bleu.SacreBleuMetric()
    split.Add('the cat sat on the mat', 'the cat sat on the mat.')
    self.assertGreater(split.value, glued.value)

  def testSignatureAndEmpty(self):
    metric = bleu.SacreBleuMetric()
    self.assertEqual(0.0, metric.value)
    self.assertIn('tok:13a', metric.signature)
    self.assertIn(f'version:{sacrebleu.__version__}', metric.signature)


if __name__ == '__main__':
  absltest.main()
