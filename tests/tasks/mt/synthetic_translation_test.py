"""Tests of the lingvo_pipe_synthetic_translation TFDS builder (offline).

The 'tiny' config (300 train, 50 validation, 50 test) is prepared once.
"""

import collections
import os
import shutil
import tempfile

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl.testing import absltest  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_datasets as tfds  # noqa: E402

from lingvo_pipe.tasks.mt import synthetic_translation as st  # noqa: E402

_TINY = st.NAME + '/tiny'


def _Load(data_dir, split):
  """[(src, tgt)] of a split as str, in file order."""
  dataset = tfds.load(_TINY, split=split, data_dir=data_dir, download=False)
  return [(ex['src'].decode(), ex['tgt'].decode())
          for ex in dataset.as_numpy_iterator()]


class TranslateTest(absltest.TestCase):

  def testSwapAdjacentPairs(self):
    self.assertEqual(st.SwapAdjacentPairs('abcde'), list('badce'))
    self.assertEqual(st.SwapAdjacentPairs('abcd'), list('badc'))
    self.assertEqual(st.SwapAdjacentPairs('a'), ['a'])

  def testTranslateMapsWordsThenSwapsPairs(self):
    words = st.SourceWords()[:5]
    m = st.WordMap()
    self.assertEqual(st.Translate(' '.join(words)),
                     ' '.join([m[words[1]], m[words[0]], m[words[3]],
                               m[words[2]], m[words[4]]]))

  def testWordMapIsOneToOneAndVocabulariesAreDisjoint(self):
    m = st.WordMap()
    self.assertLen(m, st.NUM_WORDS)
    self.assertCountEqual(m.keys(), st.SourceWords())
    self.assertLen(set(m.values()), st.NUM_WORDS)
    self.assertEmpty(set(m) & set(m.values()))


class SyntheticTranslationTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.data_dir = tempfile.mkdtemp()
    cls.builder = tfds.builder(_TINY, data_dir=cls.data_dir)
    cls.builder.download_and_prepare()
    cls.splits = {s: _Load(cls.data_dir, s)
                  for s in ('train', 'validation', 'test')}

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.data_dir, ignore_errors=True)
    super().tearDownClass()

  def testSplitsAndFeatures(self):
    info = self.builder.info
    self.assertEqual({k: v.num_examples for k, v in info.splits.items()},
                     {'train': 300, 'validation': 50, 'test': 50})
    self.assertEqual(sorted(info.features.keys()), ['src', 'tgt'])
    self.assertEqual(info.features['src'].dtype, tf.string)
    self.assertEqual(info.supervised_keys, ('src', 'tgt'))

  def testDefaultConfigSizes(self):
    config = tfds.builder(st.NAME, data_dir=self.data_dir).builder_config
    self.assertEqual(config.name, 'default')
    self.assertEqual((config.num_train_examples,
                      config.num_validation_examples,
                      config.num_test_examples), (10000, 1000, 1000))

  def testTargetIsTheTranslationOfTheSource(self):
    for pairs in self.splits.values():
      for src, tgt in pairs:
        self.assertEqual(tgt, st.Translate(src))

  def testLengthsAndWords(self):
    vocabulary = set(st.SourceWords())
    lengths = collections.Counter()
    for src, _ in self.splits['train']:
      words = src.split()
      self.assertEqual(src, ' '.join(words))  # Single spaces.
      self.assertContainsSubset(words, vocabulary)
      lengths[len(words)] += 1
    self.assertEqual(sorted(lengths), list(range(3, 13)))

  def testFrequentWordsAreFrequent(self):
    counts = collections.Counter(
        w for src, _ in self.splits['train'] for w in src.split())
    words = st.SourceWords()
    self.assertGreater(counts[words[0]], 3 * counts[words[-1]])

  def testSplitsDiffer(self):
    train = set(self.splits['train'])
    self.assertLess(len(train & set(self.splits['test'])), 5)

  def testDeterministic(self):
    other_dir = self.create_tempdir().full_path
    tfds.builder(_TINY, data_dir=other_dir).download_and_prepare()
    for split, pairs in self.splits.items():
      self.assertEqual(_Load(other_dir, split), pairs)


if __name__ == '__main__':
  absltest.main()
