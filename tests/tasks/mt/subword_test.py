"""Tests of SubwordTokenizer: ids, exact round trips, files, tf.data."""

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from lingvo_pipe.tasks.mt import subword
from lingvo_pipe.tasks.mt import synthetic_translation as st
from lingvo_pipe.tasks.mt import tokenizer
from lingvo_pipe.tasks.mt import vocabulary

_TEXTS = [ex[k] for _, ex in st.GenerateSplit('train', 2000)
          for k in (st.SOURCE_KEY, st.TARGET_KEY)]
_UNSEEN = ['the parks and catalogues', 'Grüße aus Zürich, 東京!',
           'bado kemu zzqx']


class SubwordTokenizerTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tok = subword.SubwordTokenizer.FromTexts(_TEXTS, vocab_size=400)

  def testSpecialIdsAndSize(self):
    self.assertEqual(list(tokenizer.SPECIAL_TOKENS), self.tok.Tokens()[:4])
    self.assertBetween(self.tok.VocabSize(), 300, 400)

  def testEveryTextRoundTripsWithoutUnknowns(self):
    for text in _TEXTS[:200] + _UNSEEN:
      ids = self.tok.EncodeText(text)
      self.assertNotIn(tokenizer.UNK_ID, ids, text)
      self.assertTrue(all(4 <= i < self.tok.VocabSize() for i in ids))
      self.assertEqual(text, self.tok.DecodeIds(ids))

  def testFrequentWordsAreFewPieces(self):
    # The synthetic language's words recur: most become one piece.
    words = [w for text in _TEXTS[:400] for w in text.split()]
    pieces = sum(len(self.tok.EncodeText(w)) for w in words)
    self.assertLess(pieces / len(words), 1.5)

  def testDecodeStopsAtEosAndDropsPadding(self):
    ids = self.tok.EncodeText(_TEXTS[0])
    row = [tokenizer.SOS_ID] + ids + [tokenizer.EOS_ID] + ids + [0, 0]
    self.assertEqual(_TEXTS[0], self.tok.DecodeIds(row))
    batch = np.array([row, [tokenizer.EOS_ID] + [0] * (len(row) - 1)])
    self.assertAllEqual([_TEXTS[0].encode(), b''], self.tok.Decode(batch))

  def testSaveAndLoadByFormat(self):
    path = self.create_tempfile().full_path
    self.tok.Save(path)
    loaded = vocabulary.Load(path)
    self.assertIsInstance(loaded, subword.SubwordTokenizer)
    self.assertEqual(self.tok.Tokens(), loaded.Tokens())
    words = self.create_tempfile().full_path
    tokenizer.Tokenizer.FromTexts(_TEXTS[:10]).Save(words)
    self.assertIsInstance(vocabulary.Load(words), tokenizer.Tokenizer)

  def testEncodeInATfDataMap(self):
    ds = tf.data.Dataset.from_tensor_slices(_TEXTS[:4]).map(
        tf.autograph.experimental.do_not_convert(self.tok.Encode))
    for text, ids in zip(_TEXTS[:4], ds.as_numpy_iterator()):
      self.assertEqual(self.tok.EncodeText(text), ids.tolist())

  def testTooSmallAVocabulary(self):
    with self.assertRaisesRegex(ValueError, 'vocab_size=100; use at least'):
      subword.SubwordTokenizer.FromTexts(_TEXTS, vocab_size=100)


if __name__ == '__main__':
  absltest.main()
