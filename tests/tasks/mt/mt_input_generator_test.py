"""Tests of MTInput on the synthetic pair and on mock wmt14_translate/de-en."""

import os
import shutil
import tempfile

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl.testing import absltest  # noqa: E402
from absl.testing import parameterized  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_datasets as tfds  # noqa: E402

from lingvo_pipe.tasks.mt import input_generator  # noqa: E402
from lingvo_pipe.tasks.mt import synthetic_translation as st  # noqa: E402
from lingvo_pipe.tasks.mt import subword  # noqa: E402
from lingvo_pipe.tasks.mt import tokenizer  # noqa: E402
from lingvo_pipe.tasks.mt import vocabulary  # noqa: E402

_TINY = st.NAME + '/tiny'


def _Params(data_dir, **kwargs):
  p = input_generator.MTInput.Params()
  p.Set(name='mt', dataset_name=_TINY, data_dir=data_dir, batch_size=10,
        max_length=14, seed=2)
  return p.Set(**kwargs)


def _Leaf(nested, path):
  """nested['a']['b'] for path 'a.b'."""
  for key in path.split('.'):
    nested = nested[key]
  return nested


def _Examples(inp):
  """The batches of inp as a list of per-example NestedMaps of numpy."""
  out = []
  for batch in inp.GetDataset():
    batch = batch.Transform(lambda t: t.numpy())
    for i in range(inp.params.batch_size):
      out.append(batch.Transform(lambda a, i=i: a[i]))
  return out


class MTInputTest(tf.test.TestCase, parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.data_dir = tempfile.mkdtemp()
    cls.inp = _Params(cls.data_dir).Instantiate()
    cls.examples = _Examples(cls.inp)
    dataset = tfds.load(_TINY, split='train', data_dir=cls.data_dir,
                        download=False)
    cls.raw = [(ex['src'].decode(), ex['tgt'].decode())
               for ex in dataset.as_numpy_iterator()]

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.data_dir, ignore_errors=True)
    super().tearDownClass()

  def testStaticShapesAndDtypes(self):
    spec = self.inp.InputBatchSpec()
    self.assertEqual(sorted(spec.src.keys()), ['ids', 'paddings'])
    self.assertEqual(sorted(spec.tgt.keys()),
                     ['ids', 'labels', 'paddings', 'weights'])
    for path, leaf in spec.FlattenItems():
      self.assertEqual(leaf.shape, [10, 14], path)
      self.assertEqual(leaf.dtype,
                       tf.int32 if path.endswith(('ids', 'labels'))
                       else tf.float32, path)
    self.assertLen(self.examples, 300)

  def testIdsDecodeToTheSentences(self):
    tok = self.inp.tokenizer

    def Decoded(key):
      ids = np.stack([_Leaf(ex, key)
                      for ex in self.examples])
      return [s.decode() for s in tok.Decode(ids).numpy()]

    # max_length 14 holds the longest sentences (12 words) whole.
    self.assertEqual(Decoded('src.ids'), [src for src, _ in self.raw])
    self.assertEqual(Decoded('tgt.labels'), [tgt for _, tgt in self.raw])
    self.assertEqual(Decoded('tgt.ids'), [tgt for _, tgt in self.raw])

  def testLingvoLayout(self):
    for ex, (src, tgt) in zip(self.examples, self.raw):
      n, m = len(src.split()), len(tgt.split())
      self.assertEqual(ex.src.ids[n], tokenizer.EOS_ID)
      self.assertAllEqual(ex.src.paddings, np.arange(14) > n)
      self.assertAllEqual(ex.src.ids[n + 1:], np.zeros(13 - n))
      self.assertEqual(ex.tgt.ids[0], tokenizer.SOS_ID)
      self.assertAllEqual(ex.tgt.ids[1:m + 1], ex.tgt.labels[:m])
      self.assertEqual(ex.tgt.labels[m], tokenizer.EOS_ID)
      self.assertAllEqual(ex.tgt.paddings, np.arange(14) > m)
      self.assertAllEqual(ex.tgt.weights, 1.0 - ex.tgt.paddings)
      self.assertAllEqual(ex.tgt.ids[m + 1:], np.zeros(13 - m))
      self.assertAllEqual(ex.tgt.labels[m + 1:], np.zeros(13 - m))

  def testTruncationKeepsSosAndEos(self):
    inp = _Params(self.data_dir, max_length=4).Instantiate()
    sources = inp.tokenizer.Encode([src for src, _ in self.raw]).to_list()
    targets = inp.tokenizer.Encode([tgt for _, tgt in self.raw]).to_list()
    for ex, src, tgt in zip(_Examples(inp), sources, targets):
      self.assertAllEqual(ex.src.ids[:3], src[:3])
      self.assertEqual(ex.src.ids[3], tokenizer.EOS_ID)
      self.assertAllEqual(ex.tgt.ids, [tokenizer.SOS_ID] + tgt[:3])
      self.assertAllEqual(ex.tgt.labels[:3], tgt[:3])
      self.assertEqual(ex.tgt.labels[3], tokenizer.EOS_ID)
      self.assertAllEqual(ex.tgt.paddings, np.zeros(4))  # Every sentence >= 3.

  def testVocabularyIsBuiltFromTrainAndCached(self):
    tok = self.inp.tokenizer
    # 4 special ids, then every word of both languages (all of them occur
    # in the 300 training pairs).
    self.assertEqual(tok.VocabSize(), 4 + 2 * st.NUM_WORDS)
    path = self.inp.VocabFile()
    self.assertStartsWith(path, os.path.join(self.data_dir,
                                             'lingvo_pipe_vocab'))
    self.assertEqual(tokenizer.Tokenizer.FromFile(path).Tokens(),
                     tok.Tokens())

  def testCachedVocabularyIsReused(self):
    data_dir = self.create_tempdir().full_path
    first = _Params(data_dir).Instantiate()
    path = first.VocabFile()
    tokenizer.Tokenizer(list(tokenizer.SPECIAL_TOKENS) + ['x']).Save(path)
    # The input loads the file instead of building a vocabulary.
    self.assertEqual(first.tokenizer.VocabSize(), 5)

  def testVocabFileParam(self):
    path = os.path.join(self.create_tempdir().full_path, 'v.txt')
    words = st.SourceWords()[:3]
    tokenizer.Tokenizer(list(tokenizer.SPECIAL_TOKENS) + words).Save(path)
    inp = _Params(self.data_dir, vocab_file=path).Instantiate()
    self.assertEqual(inp.tokenizer.VocabSize(), 7)
    ex = _Examples(inp)[0]
    self.assertContainsSubset(ex.src.ids.tolist(), {0, 2, 3, 4, 5, 6})

  def testSubwordVocabulary(self):
    path = os.path.join(self.create_tempdir().full_path, 'vocab.txt')
    inp = _Params(self.data_dir, tokenizer='subword', max_vocab_size=400,
                  max_length=64,  # no sentence truncated
                  vocab_file=path).Instantiate()
    tok = inp.tokenizer
    self.assertIsInstance(tok, subword.SubwordTokenizer)
    self.assertIsInstance(vocabulary.Load(path), subword.SubwordTokenizer)
    for ex, (src, tgt) in zip(_Examples(inp), self.raw):
      n = int(np.sum(ex.src.paddings == 0))
      self.assertEqual(tokenizer.EOS_ID, ex.src.ids[n - 1])
      self.assertEqual(src, tok.DecodeIds(ex.src.ids))
      self.assertEqual(tgt, tok.DecodeIds(ex.tgt.labels))
      self.assertEqual(tokenizer.SOS_ID, ex.tgt.ids[0])
    with self.assertRaisesRegex(ValueError, "p.tokenizer is 'bpe'"):
      _Params(self.data_dir, tokenizer='bpe').Instantiate()

  def testMissingVocabFileIsBuiltThere(self):
    # A run's jobs share the file: the first builds it, the others read it.
    path = os.path.join(self.create_tempdir().full_path, 'run', 'vocab.txt')
    first = _Params(self.data_dir, vocab_file=path).Instantiate()
    built = first.tokenizer.Tokens()
    self.assertTrue(os.path.exists(path))
    self.assertEqual(built, vocabulary.Load(path).Tokens())
    second = _Params(self.data_dir, vocab_file=path).Instantiate()
    self.assertEqual(built, second.tokenizer.Tokens())

  def testSeededShuffleIsDeterministic(self):
    def Ids(seed):
      p = _Params(self.data_dir, shuffle_buffer_size=100, seed=seed,
                  num_examples=100)
      return np.stack([ex.src.ids for ex in _Examples(p.Instantiate())])

    self.assertAllEqual(Ids(7), Ids(7))
    self.assertNotAllEqual(Ids(7), Ids(8))

  def testBadMaxLength(self):
    with self.assertRaisesRegex(ValueError, 'p.max_length is 1'):
      _Params(self.data_dir, max_length=1).Instantiate()


class MockWmtTest(tf.test.TestCase):
  """MTInput on a catalog dataset, through the real tfds.load path."""

  def setUp(self):
    super().setUp()
    self.data_dir = self.create_tempdir().full_path
    self.enter_context(tfds.testing.mock_data(num_examples=12))

  def _Params(self, **kwargs):
    return _Params(self.data_dir, dataset_name='wmt14_translate/de-en',
                   source_key='de', target_key='en', batch_size=4,
                   max_length=8).Set(**kwargs)

  def testBatches(self):
    inp = self._Params().Instantiate()
    batches = list(inp.GetDataset())
    self.assertLen(batches, 3)
    self.assertEqual(batches[0].src.ids.shape, [4, 8])
    self.assertEqual(batches[0].tgt.labels.shape, [4, 8])
    raw = tfds.load('wmt14_translate/de-en', split='train',
                    data_dir=self.data_dir, download=False)
    raw_de = [' '.join(ex['de'].decode().split()[:7])
              for ex in raw.as_numpy_iterator()]
    decoded = [s.decode() for b in batches
               for s in inp.tokenizer.Decode(b.src.ids).numpy()]
    self.assertEqual(decoded, raw_de)  # Every word is in the vocabulary.
    self.assertTrue(os.path.exists(inp.VocabFile()))

  def testMissingKeyIsAnError(self):
    inp = self._Params(source_key='fr').Instantiate()
    with self.assertRaisesRegex(ValueError, "no feature 'fr'.*'de', 'en'"):
      inp.GetDataset()


if __name__ == '__main__':
  absltest.main()
