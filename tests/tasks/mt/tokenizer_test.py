"""Tests of the word-level Tokenizer: vocabulary order, TF-op round trips."""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl.testing import absltest  # noqa: E402
from absl.testing import parameterized  # noqa: E402
import tensorflow as tf  # noqa: E402

from lingvo_pipe.tasks.mt import tokenizer  # noqa: E402

_TEXTS = ['the cat sat', 'the dog sat', 'a cat', b'the end']
# Counts: the 3, cat 2, sat 2, a 1, dog 1, end 1.
_WORDS = ['the', 'cat', 'sat', 'a', 'dog', 'end']


class TokenizerTest(tf.test.TestCase, parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.tok = tokenizer.Tokenizer.FromTexts(_TEXTS)

  def _Id(self, word):
    return 4 + _WORDS.index(word)

  def testVocabularyIsSpecialsThenByCountThenAlphabetical(self):
    self.assertEqual(self.tok.Tokens(),
                     ['<pad>', '<s>', '</s>', '<unk>'] + _WORDS)
    self.assertEqual(self.tok.VocabSize(), 10)
    self.assertEqual((tokenizer.PAD_ID, tokenizer.SOS_ID, tokenizer.EOS_ID,
                      tokenizer.UNK_ID), (0, 1, 2, 3))
    # Same vocabulary whatever the order of the texts.
    self.assertEqual(tokenizer.Tokenizer.FromTexts(_TEXTS[::-1]).Tokens(),
                     self.tok.Tokens())

  def testMaxVocabSizeKeepsTheMostFrequent(self):
    tok = tokenizer.Tokenizer.FromTexts(_TEXTS, max_vocab_size=6)
    self.assertEqual(tok.Tokens()[4:], ['the', 'cat'])
    with self.assertRaisesRegex(ValueError, 'max_vocab_size is 4'):
      tokenizer.Tokenizer.FromTexts(_TEXTS, max_vocab_size=4)

  def testEncode(self):
    ids = self.tok.Encode('the  dog sat ')
    self.assertEqual(ids.dtype, tf.int32)
    self.assertAllEqual(ids, [self._Id('the'), self._Id('dog'),
                              self._Id('sat')])

  def testUnknownWordsAndSpecialTokensInTextAreUnk(self):
    self.assertAllEqual(self.tok.Encode('the zebra <s> </s> <pad>'),
                        [self._Id('the'), 3, 3, 3, 3])

  def testEncodeBatchIsRagged(self):
    ids = self.tok.Encode(['a cat', 'the end sat'])
    self.assertIsInstance(ids, tf.RaggedTensor)
    self.assertEqual(ids.to_list(), [[7, 5], [4, 9, 6]])

  @parameterized.parameters('the cat sat', 'a', 'end end the dog', '')
  def testRoundTrip(self, text):
    self.assertEqual(self.tok.Decode(self.tok.Encode(text)).numpy(),
                     text.encode())

  def testRoundTripBatch(self):
    texts = ['the cat sat', 'a', 'dog dog dog dog']
    self.assertAllEqual(self.tok.Decode(self.tok.Encode(texts)),
                        [t.encode() for t in texts])

  def testDecodeStopsAtEosAndDropsSosAndPad(self):
    cat, sat = self._Id('cat'), self._Id('sat')
    self.assertEqual(self.tok.Decode([1, cat, 0, sat, 2, cat, 0]).numpy(),
                     b'cat sat')
    self.assertAllEqual(self.tok.Decode([[cat, 2, sat], [sat, sat, 0]]),
                        [b'cat', b'sat sat'])

  def testDecodeOutOfRangeIsUnk(self):
    self.assertEqual(self.tok.Decode([4, 99, -1]).numpy(),
                     b'the <unk> <unk>')

  def testWorksInsideTfData(self):
    dataset = tf.data.Dataset.from_tensor_slices(['the cat', 'a zebra'])
    dataset = dataset.map(
        tf.autograph.experimental.do_not_convert(self.tok.Encode)).map(
            tf.autograph.experimental.do_not_convert(self.tok.Decode))
    self.assertEqual(list(dataset.as_numpy_iterator()),
                     [b'the cat', b'a <unk>'])

  def testWorksInsideTfFunction(self):
    round_trip = tf.function(lambda s: self.tok.Decode(self.tok.Encode(s)),
                             autograph=False)
    self.assertEqual(round_trip(tf.constant('sat the cat')).numpy(),
                     b'sat the cat')

  def testSaveAndLoad(self):
    path = os.path.join(self.create_tempdir().full_path, 'sub', 'vocab.txt')
    self.tok.Save(path)
    with open(path) as f:
      self.assertEqual(f.read(), '\n'.join(self.tok.Tokens()) + '\n')
    loaded = tokenizer.Tokenizer.FromFile(path)
    self.assertEqual(loaded.Tokens(), self.tok.Tokens())
    self.assertAllEqual(loaded.Encode('the end x'), self.tok.Encode(
        'the end x'))

  def testUnicodeWords(self):
    tok = tokenizer.Tokenizer.FromTexts(['über straße', 'straße'])
    self.assertEqual(tok.Tokens()[4:], ['straße', 'über'])
    self.assertEqual(tok.Decode(tok.Encode('über straße')).numpy().decode(),
                     'über straße')
    path = os.path.join(self.create_tempdir().full_path, 'vocab.txt')
    tok.Save(path)
    self.assertEqual(tokenizer.Tokenizer.FromFile(path).Tokens(),
                     tok.Tokens())

  @parameterized.parameters(
      (['<pad>', '<s>', '</s>'], 'starts with'),
      (['a', '<pad>', '<s>', '</s>', '<unk>'], 'starts with'),
      (['<pad>', '<s>', '</s>', '<unk>', 'a', 'a'], 'duplicate'),
      (['<pad>', '<s>', '</s>', '<unk>', 'a b'], 'whitespace'),
  )
  def testBadVocabulary(self, tokens, message):
    with self.assertRaisesRegex(ValueError, message):
      tokenizer.Tokenizer(tokens)

  def testBadVocabularyFileNamesTheFile(self):
    path = os.path.join(self.create_tempdir().full_path, 'vocab.txt')
    with open(path, 'w') as f:
      f.write('a\nb\n')
    with self.assertRaisesRegex(ValueError, 'Bad vocabulary file .*vocab.txt'):
      tokenizer.Tokenizer.FromFile(path)


if __name__ == '__main__':
  absltest.main()
