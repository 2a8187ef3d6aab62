"""Tests of BaseInputGenerator: loading, errors, batching, seeded shuffling.

Offline: catalog datasets come from tfds.testing.mock_data; the local
builder is lingvo_pipe_synthetic_translation/tiny (400 short text pairs),
prepared once per test class into a temporary data_dir.
"""

import inspect
import logging
import os
import shutil
import tempfile

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl.testing import absltest  # noqa: E402
from absl.testing import parameterized  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_datasets as tfds  # noqa: E402

from lingvo_pipe.core import base_input_generator  # noqa: E402
from lingvo_pipe.core.nested_map import NestedMap  # noqa: E402
from lingvo_pipe.tasks.mt import synthetic_translation  # noqa: E402

_LOCAL = synthetic_translation.NAME + '/tiny'
_NUM_TRAIN = 300  # Of the tiny config.


def _Params(**kwargs):
  p = base_input_generator.BaseInputGenerator.Params()
  p.Set(name='test_input', seed=1)
  return p.Set(**kwargs)


def _Sources(dataset):
  """The 'src' strings of every batch, in order, as one list."""
  return [s for batch in dataset for s in batch.src.numpy().tolist()]


class _SeedInput(base_input_generator.BaseInputGenerator):
  """Returns the per-example seed that GetDataset passes to Preprocess."""

  def Preprocess(self, example, seed):
    return NestedMap(seed=seed, src=example['src'])


class _RaggedInput(base_input_generator.BaseInputGenerator):
  """Returns a variable-length tensor: GetDataset must reject it."""

  def Preprocess(self, example, seed):
    return NestedMap(words=tf.strings.split(example['src']))


class _WhereInput(base_input_generator.BaseInputGenerator):
  """Records the file its Preprocess code runs from, once per trace."""

  files = []

  def _LoadExamples(self):
    return tf.data.Dataset.from_tensor_slices({'x': tf.range(4)})

  def Preprocess(self, example, seed):
    del seed
    _WhereInput.files.append(inspect.currentframe().f_code.co_filename)
    return base_input_generator._ToNestedMap(example)  # pylint: disable=protected-access


class _InMemoryInput(base_input_generator.BaseInputGenerator):
  """Overrides _LoadExamples: no TFDS at all."""

  def _LoadExamples(self):
    return tf.data.Dataset.from_tensor_slices({'x': tf.range(10)})


class _Records(logging.Handler):
  """Collects the messages of records at `level` or above."""

  def __init__(self, level):
    super().__init__(level)
    self.messages = []

  def emit(self, record):
    self.messages.append(record.getMessage())


class BaseInputGeneratorTest(tf.test.TestCase, parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.data_dir = tempfile.mkdtemp()
    tfds.builder(_LOCAL, data_dir=cls.data_dir).download_and_prepare()

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.data_dir, ignore_errors=True)
    super().tearDownClass()

  def _Local(self, **kwargs):
    return _Params(dataset_name=_LOCAL, data_dir=self.data_dir, **kwargs)

  # ---- params ---------------------------------------------------------

  @parameterized.parameters(
      (dict(dataset_name=''), 'p.dataset_name'),
      (dict(dataset_name='cifar10', batch_size=0), 'p.batch_size is 0'),
      (dict(dataset_name='cifar10', shuffle_buffer_size=-1),
       'p.shuffle_buffer_size is -1'),
      (dict(dataset_name='cifar10', num_examples=0), 'p.num_examples is 0'),
      (dict(dataset_name='cifar10', seed=1.5), 'p.seed is 1.5'),
  )
  def testBadParams(self, kwargs, message):
    with self.assertRaisesRegex(ValueError, "'test_input'.*" + message):
      _Params(**kwargs).Instantiate()

  def testSeedNoneIsDrawnAndRecorded(self):
    inp = _Params(dataset_name='cifar10', seed=None).Instantiate()
    self.assertIsInstance(inp.params.seed, int)
    self.assertTrue(inp.params.IsFrozen())

  # ---- where the data comes from --------------------------------------

  def testMissingCatalogDatasetIsAOneLineError(self):
    empty = self.create_tempdir().full_path
    inp = _Params(dataset_name='cifar10', data_dir=empty).Instantiate()
    with self.assertRaises(FileNotFoundError) as caught:
      inp.GetDataset()
    message = str(caught.exception)
    self.assertNotIn('\n', message)
    for part in ("'test_input'", "dataset 'cifar10' is not prepared",
                 repr(empty), 'tfds build cifar10', '--data_dir',
                 'p.download=True'):
      self.assertIn(part, message)
    self.assertEqual(os.listdir(empty), [])  # Nothing was downloaded.

  def testIsLocalBuilder(self):
    self.assertTrue(base_input_generator.IsLocalBuilder(_LOCAL))
    self.assertTrue(base_input_generator.IsLocalBuilder(
        synthetic_translation.NAME + '/default:1.0.0'))
    self.assertFalse(base_input_generator.IsLocalBuilder('cifar10'))
    self.assertFalse(base_input_generator.IsLocalBuilder('no_such_dataset'))

  def testLocalBuilderIsPreparedOnFirstUse(self):
    data_dir = self.create_tempdir().full_path
    inp = _Params(dataset_name=_LOCAL, data_dir=data_dir,
                  batch_size=100).Instantiate()
    warnings = _Records('WARNING')
    logging.getLogger().addHandler(warnings)
    try:
      self.assertLen(list(inp.GetDataset()), 3)
    finally:
      logging.getLogger().removeHandler(warnings)
    # TFDS's warning about the folder it is preparing is not shown; the
    # filter is gone afterwards, so other warnings still are.
    self.assertFalse([m for m in warnings.messages if 'Variant folder' in m],
                     warnings.messages)
    self.assertFalse(logging.getLogger('absl').filters)
    builder = tfds.builder(_LOCAL, data_dir=data_dir)
    self.assertTrue(builder.is_prepared())
    self.assertEqual(inp.NumExamples(), _NUM_TRAIN)

  def testCatalogDatasetThroughTfdsLoad(self):
    # mock_data patches tfds.load's reading: this is the real load path.
    with tfds.testing.mock_data(num_examples=20):
      inp = _Params(dataset_name='cifar10', batch_size=8,
                    data_dir=self.create_tempdir().full_path).Instantiate()
      batches = list(inp.GetDataset())
      spec = inp.InputBatchSpec()
    self.assertLen(batches, 2)  # 20 // 8: the remainder is dropped.
    self.assertIsInstance(batches[0], NestedMap)
    self.assertEqual(spec.image.shape, [8, 32, 32, 3])
    self.assertEqual(spec.image.dtype, tf.uint8)
    self.assertEqual(spec.label.shape, [8])

  # ---- the pipeline ---------------------------------------------------

  def testBatchesHaveAStaticBatchDim(self):
    dataset = self._Local(batch_size=7).Instantiate().GetDataset()
    self.assertEqual(dataset.element_spec.src.shape, [7])
    batches = list(dataset)
    self.assertLen(batches, _NUM_TRAIN // 7)
    self.assertTrue(all(b.src.shape == [7] for b in batches))

  def testNoShuffleReadsInFileOrder(self):
    read = tfds.load(_LOCAL, split='train', data_dir=self.data_dir,
                     download=False)
    in_order = [ex['src'] for ex in read.as_numpy_iterator()]
    got = _Sources(self._Local(batch_size=10).Instantiate().GetDataset())
    self.assertEqual(got, in_order)

  def testSeededShuffleIsDeterministic(self):
    def Order(seed):
      p = self._Local(batch_size=10, shuffle_buffer_size=100, seed=seed)
      return _Sources(p.Instantiate().GetDataset())

    first = Order(5)
    self.assertEqual(first, Order(5))
    self.assertNotEqual(first, Order(6))
    in_order = _Sources(self._Local(batch_size=10).Instantiate().GetDataset())
    self.assertNotEqual(first, in_order)
    self.assertCountEqual(first, in_order)

  def testRepeatReshufflesEachEpoch(self):
    p = self._Local(batch_size=10, shuffle_buffer_size=_NUM_TRAIN,
                    repeat=True)
    batches = list(p.Instantiate().GetDataset().take(2 * _NUM_TRAIN // 10))
    sources = [s for b in batches for s in b.src.numpy().tolist()]
    epoch1, epoch2 = sources[:_NUM_TRAIN], sources[_NUM_TRAIN:]
    self.assertCountEqual(epoch1, epoch2)
    self.assertNotEqual(epoch1, epoch2)

  def testNumExamplesTakesTheFirstExamples(self):
    inp = self._Local(batch_size=4, num_examples=10).Instantiate()
    got = _Sources(inp.GetDataset())
    everything = _Sources(self._Local(batch_size=4).Instantiate().GetDataset())
    self.assertEqual(got, everything[:8])  # 10 // 4 batches.
    self.assertEqual(inp.NumExamples(), 10)

  def testPreprocessSeedIsPerExampleAndDeterministic(self):
    p = self._Local(batch_size=10, repeat=True, seed=42)
    p.cls = _SeedInput
    seeds = [b.seed.numpy() for b in p.Instantiate().GetDataset().take(40)]
    seeds = [tuple(s) for batch in seeds for s in batch]
    # One epoch is 300 examples: 400 seeds cross the epoch boundary.
    self.assertEqual(seeds, [(42, i) for i in range(400)])

  def testOverriddenLoadExamples(self):
    p = _Params(dataset_name='in_memory', batch_size=4)
    p.cls = _InMemoryInput
    inp = p.Instantiate()
    self.assertEqual([b.x.numpy().tolist() for b in inp.GetDataset()],
                     [[0, 1, 2, 3], [4, 5, 6, 7]])
    self.assertIsNone(inp.DatasetInfo())
    self.assertIsNone(inp.NumExamples())

  def testPreprocessRunsAsWrittenNotThroughAutoGraph(self):
    # AutoGraph would run a converted copy from a generated file (and write
    # it to /tmp); the house style is plain Python over TF ops everywhere.
    p = _Params(dataset_name='in_memory', batch_size=2)
    p.cls = _WhereInput
    _WhereInput.files = []
    batches = list(p.Instantiate().GetDataset())
    self.assertEqual([b.x.numpy().tolist() for b in batches], [[0, 1], [2, 3]])
    self.assertEqual(set(_WhereInput.files), {__file__})

  def testVariableShapeFromPreprocessIsAnError(self):
    p = self._Local()
    p.cls = _RaggedInput
    with self.assertRaisesRegex(ValueError, "'words'.*fixed shape"):
      p.Instantiate().GetDataset()


if __name__ == '__main__':
  absltest.main()
