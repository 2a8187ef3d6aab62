"""Tests of MultilingualMTInput on the tiny synthetic multilingual data."""

import collections
import shutil
import tempfile

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from lingvo_pipe.tasks.mt import multilingual_input as mi
from lingvo_pipe.tasks.mt import synthetic_multilingual as sm
from lingvo_pipe.tasks.mt import synthetic_translation as st
from lingvo_pipe.tasks.mt import vocabulary

_TINY = sm.NAME + '/tiny'
_PAIRS = [(None, 'en', 'xx', 3.0), (None, 'yy', 'en', 1.0)]


def _Params(data_dir, **kwargs):
  p = mi.MultilingualMTInput.Params().Set(
      name='ml', dataset_name=_TINY, data_dir=data_dir, batch_size=10,
      max_length=16, split='train', pairs=_PAIRS, seed=3)
  return p.Set(**kwargs)


class MultilingualInputTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.data_dir = tempfile.mkdtemp()

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.data_dir, ignore_errors=True)
    super().tearDownClass()

  def testTranslatesWithALanguageTokenFirst(self):
    inp = _Params(self.data_dir).Instantiate()
    tok = inp.tokenizer
    self.assertEqual(['en-xx', 'yy-en'], inp.PairNames())
    batch = next(iter(inp.GetDataset()))
    for src, tgt, pair in zip(tok.Decode(batch.src.ids).numpy(),
                              tok.Decode(batch.tgt.labels).numpy(),
                              batch.pair.numpy()):
      token, sentence = src.decode().split(' ', 1)
      source, target = _PAIRS[pair][1], _PAIRS[pair][2]
      self.assertEqual(mi.LanguageToken(target), token)
      if source == 'en':
        english = sentence
      else:  # yy: its words, reversed
        back = {v: k for k, v in sm.WordMap('yy').items()}
        english = ' '.join(back[w] for w in sentence.split()[::-1])
      self.assertEqual(sm.Translate(english, target), tgt.decode())

  def testTrainingMixFollowsTheWeights(self):
    inp = _Params(self.data_dir, repeat=True).Instantiate()
    counts = collections.Counter()
    for batch in inp.GetDataset().take(40):
      counts.update(batch.pair.numpy().tolist())
    self.assertBetween(counts[0] / (counts[0] + counts[1]), 0.68, 0.82)

  def testEvaluationReadsEveryPairInFull(self):
    inp = _Params(self.data_dir, split='test', batch_size=5).Instantiate()
    pairs = np.concatenate([b.pair.numpy() for b in inp.GetDataset()])
    self.assertEqual({0: 50, 1: 50}, dict(collections.Counter(pairs)))
    self.assertNotEqual(50, int(np.argmax(pairs == 1)))  # interleaved

  def testSubwordVocabularyKeepsLanguageTokensWhole(self):
    path = self.create_tempdir().full_path + '/vocab'
    inp = _Params(self.data_dir, tokenizer='subword', max_vocab_size=400,
                  vocab_file=path).Instantiate()
    inp.tokenizer  # pylint: disable=pointless-statement  (builds it)
    tok = vocabulary.Load(path)
    pieces = tok.Tokens()
    for token in ('<2xx>', '<2en>'):  # one piece each, never split
      self.assertIn(pieces.index(token), tok.EncodeText(f'{token} bado'))
    batch = next(iter(inp.GetDataset()))
    self.assertTrue(all(tok.DecodeIds(row).startswith('<2')
                        for row in batch.src.ids.numpy()))

  def testPairsFromTwoDatasets(self):
    # The synthetic pair ('src' -> 'tgt') beside a multilingual one.
    pairs = [(None, 'en', 'zz', 1.0),
             (st.NAME + '/tiny', st.SOURCE_KEY, st.TARGET_KEY, 1.0)]
    inp = _Params(self.data_dir, split='test', pairs=pairs).Instantiate()
    tok = inp.tokenizer
    seen = set()
    for batch in inp.GetDataset():
      for src, tgt, pair in zip(tok.Decode(batch.src.ids).numpy(),
                                tok.Decode(batch.tgt.labels).numpy(),
                                batch.pair.numpy()):
        words = src.decode().split()[1:]
        want = (sm.Translate(' '.join(words), 'zz') if pair == 0 else
                st.Translate(' '.join(words)))
        self.assertEqual(want, tgt.decode())
        seen.add(int(pair))
    self.assertEqual({0, 1}, seen)

  def testBadPairs(self):
    with self.assertRaisesRegex(ValueError, 'p.pairs is empty'):
      _Params(self.data_dir, pairs=[]).Instantiate()
    with self.assertRaisesRegex(ValueError, 'repeats a language pair'):
      _Params(self.data_dir, pairs=_PAIRS + [_PAIRS[0]]).Instantiate()
    inp = _Params(self.data_dir, pairs=[(None, 'en', 'fr', 1.0)],
                  vocab_file=self.create_tempdir().full_path + '/v')
    with self.assertRaisesRegex(ValueError, r"no feature \['fr'\]"):
      inp.Instantiate().GetDataset()


if __name__ == '__main__':
  absltest.main()
