"""BaseInputGenerator: batches of NestedMaps from a TFDS dataset.

  p = ImageClassificationInput.Params().Set(
      name='train', dataset_name='cifar10', split='train', batch_size=128,
      shuffle_buffer_size=10000, repeat=True, seed=1)
  dataset = p.Instantiate().GetDataset()  # NestedMap batches

`GetDataset()` builds this pipeline::

  _LoadExamples()     tfds.load(dataset_name, split): dicts of features
  take(n)             if num_examples >= 0
  shuffle(b, seed)    if shuffle_buffer_size > 0 (files are shuffled too)
  repeat()            if repeat
  Preprocess(ex, s)   s = [seed, example index]: a stateless-op seed
  _Batch              batch(batch_size), drop_remainder=True: the batch
                      dim is static (MTInput: or length buckets)
  prefetch            if prefetch

The same params and seed give the same batches, augmentation included.

Where the data comes from:
- Catalog datasets ('cifar10', 'wmt14_translate/de-en', ...) must already be
  prepared in `data_dir` (or TFDS's default directory): this machine has no
  internet access, so they are downloaded only if `download` is True.
- Builders defined in the lingvo_pipe package (local builders, such as
  'lingvo_pipe_synthetic_images') generate their data here: they are
  prepared into `data_dir` on first use. Their module must be imported so
  that TFDS knows the name.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
from typing import Any, Dict, Iterator, List, NoReturn, Optional, Tuple

import tensorflow as tf
import tensorflow_datasets as tfds

from lingvo_pipe.core import hyperparams
from lingvo_pipe.core.nested_map import NestedMap

# Builders whose class lives in a module under this prefix make their data
# without downloads, so they are prepared on first use.
_LOCAL_BUILDER_MODULE_PREFIX = 'lingvo_pipe.'


def BuilderBaseName(dataset_name: str) -> str:
  """'wmt14_translate/de-en:1.0.0' -> 'wmt14_translate'."""
  return dataset_name.split('/')[0].split(':')[0]


def IsLocalBuilder(dataset_name: str) -> bool:
  """Whether `dataset_name` is a registered builder defined in lingvo_pipe."""
  try:
    cls = tfds.builder_cls(BuilderBaseName(dataset_name))
  except tfds.core.registered.DatasetNotFoundError:
    return False
  return cls.__module__.startswith(_LOCAL_BUILDER_MODULE_PREFIX)


class _NoFreshVariantWarning(logging.Filter):
  """Drops TFDS's warning that a dataset's version folder has no
  dataset_info.json, which it logs when it finds the folder it is about to
  prepare (every first preparation, seen with TFDS 4.9 on 2026-11-27)."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not (str(record.msg).startswith('Variant folder') and
                'dataset_info.json' in record.getMessage())


@contextlib.contextmanager
def _QuietFirstPreparation(preparing: bool) -> Iterator[None]:
  """Inside, with `preparing`, that warning is dropped; any other stays.
  Without it (the dataset must already be there) an incomplete folder is
  worth the warning."""
  if not preparing:
    yield
    return
  absl_logger, drop = logging.getLogger('absl'), _NoFreshVariantWarning()
  absl_logger.addFilter(drop)
  try:
    yield
  finally:
    absl_logger.removeFilter(drop)


class DataError(ValueError):
  """The data an input would read cannot be trained on; the one-line message
  names the file or folder and says what to change."""


def InputName(p: hyperparams.Params) -> str:
  """How errors name the input of params `p`: its class and name."""
  return f'{p.cls.__name__} {p.name!r}'


def DataRoot(p: hyperparams.Params) -> str:
  """p.data_dir, made absolute if it is a local path (not a URL)."""
  path = os.fspath(p.data_dir)
  return path if '://' in path else os.path.abspath(path)


class BaseInputGenerator:
  """Reads a TFDS split and yields batches of `Preprocess`ed NestedMaps.

  Subclasses override `Preprocess` (one example -> NestedMap of tensors with
  fixed shapes) and may add params. See the module docstring.
  """

  @classmethod
  def FillFromData(cls, input_p: hyperparams.Params,
                   model_p: hyperparams.Params) -> None:
    """Checks the data `input_p` reads; fills params that come from it.

    The trainer calls it for each input (train, dev, test in that order)
    after the overrides and --data_dir, before anything is built. An input
    whose params depend on its data (classes counted from a folder, the
    languages of its files) sets them here in `input_p` and `model_p` (the
    model params: task, *_input), and raises DataError if the data cannot
    be used. The default does nothing.
    """
    del input_p, model_p  # Unused.

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = hyperparams.InstantiableParams(cls)
    p.Define('name', 'input', 'Name of this input, used in error messages.')
    p.Define('dataset_name', '',
             "TFDS name, e.g. 'cifar10', 'wmt14_translate/de-en' or a local "
             "builder such as 'lingvo_pipe_synthetic_images'.")
    p.Define('split', 'train',
             "TFDS split: 'train', 'test', 'validation', or a slice such as "
             "'train[:90%]'.")
    p.Define('data_dir', None,
             'TFDS data directory; None means the TFDS default '
             '($TFDS_DATA_DIR or ~/tensorflow_datasets).')
    p.Define('batch_size', 32,
             'Examples per batch. Batches have exactly this many examples '
             '(the remainder is dropped), so the batch dim is static.')
    p.Define('shuffle_buffer_size', 0,
             'Examples in the shuffle buffer; 0 means no shuffling (and the '
             'files are read in order).')
    p.Define('seed', None,
             'Seed of shuffling and of Preprocess randomness (e.g. '
             'augmentation); None draws one at construction.')
    p.Define('repeat', False,
             'Repeat the split forever (True for training).')
    p.Define('num_examples', -1,
             'Use only the first this many examples of the split; -1 means '
             'all of them.')
    p.Define('prefetch', True, 'Prefetch batches (tf.data.AUTOTUNE).')
    p.Define('download', False,
             'Let tfds.load download and prepare a missing catalog dataset. '
             'Local builders are always prepared when missing.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    p = params.Copy()
    if p.seed is None:
      p.seed = random.SystemRandom().randrange(2**31)
    self._params = p.Freeze()
    self._CheckParams()
    self._info: Optional[tfds.core.DatasetInfo] = None

  def _Fail(self, message: str) -> NoReturn:
    raise ValueError(f'{InputName(self._params)}: {message}')

  def _CheckParams(self) -> None:
    p = self._params
    if not isinstance(p.dataset_name, str) or not p.dataset_name:
      self._Fail("set p.dataset_name to a TFDS name, e.g. 'cifar10'.")
    if not isinstance(p.batch_size, int) or p.batch_size < 1:
      self._Fail(f'p.batch_size is {p.batch_size!r}; set a positive int.')
    if not isinstance(p.shuffle_buffer_size, int) or (
        p.shuffle_buffer_size < 0):
      self._Fail(f'p.shuffle_buffer_size is {p.shuffle_buffer_size!r}; set '
                 'an int >= 0 (0 means no shuffling).')
    if not isinstance(p.num_examples, int) or (
        p.num_examples != -1 and p.num_examples < 1):
      self._Fail(f'p.num_examples is {p.num_examples!r}; set -1 (all) or a '
                 'positive int.')
    if not isinstance(p.seed, int):
      self._Fail(f'p.seed is {p.seed!r}; set an int, or None.')

  @property
  def params(self) -> hyperparams.Params:
    """This input's params (a frozen copy, with the seed filled in)."""
    return self._params

  # ---- loading ------------------------------------------------------

  def _LoadSplit(self, split: str, shuffle_files: bool,
                 dataset_name: Optional[str] = None) -> tf.data.Dataset:
    """tfds.load of `split`: dicts of features, one per example.

    Of p.dataset_name, or of `dataset_name` (inputs reading several;
    self.DatasetInfo() is then the last one's). Prepares a local builder
    that is missing from data_dir; turns a missing catalog dataset into a
    one-line error saying how to prepare it.
    """
    p = self._params
    dataset_name = dataset_name or p.dataset_name
    download = p.download or IsLocalBuilder(dataset_name)
    # TFDS caches small datasets in memory; an evaluation reading part of
    # one drops the cache with a warning at every evaluation. Only inputs
    # that repeat (training) read whole passes.
    read_config = tfds.ReadConfig(shuffle_seed=p.seed,
                                  try_autocache=bool(p.repeat))
    try:
      with _QuietFirstPreparation(download):
        dataset, info = tfds.load(
            dataset_name, split=split, data_dir=p.data_dir,
            shuffle_files=shuffle_files, download=download,
            as_supervised=False, read_config=read_config, with_info=True)
    except AssertionError as e:  # TFDS's "could not find data in <dir>".
      if download:
        raise
      where = p.data_dir or tfds.core.constants.DATA_DIR
      raise FileNotFoundError(
          f'{InputName(p)}: dataset {dataset_name!r} is '
          f'not prepared in data_dir {where!r} and this input does not '
          'download it; on a machine with internet access run `tfds build '
          f'{dataset_name} --data_dir=DIR`, copy DIR here and pass '
          '--data_dir=DIR (p.data_dir), or set p.download=True.') from e
    self._info = info
    return dataset

  def _LoadFromBuilder(self, builder: tfds.core.DatasetBuilder, split: str,
                       shuffle_files: bool) -> tf.data.Dataset:
    """`split` of a builder made by the input, as _LoadSplit reads one by
    name: e.g. tfds.folder_dataset's, which read a user's files in place."""
    dataset = builder.as_dataset(
        split=split, shuffle_files=shuffle_files,
        read_config=tfds.ReadConfig(shuffle_seed=self._params.seed,
                                    try_autocache=bool(self._params.repeat)))
    self._info = builder.info
    return dataset

  def _LoadExamples(self) -> tf.data.Dataset:
    """The examples of p.split, before take/shuffle/repeat (dicts)."""
    p = self._params
    dataset = self._LoadSplit(p.split, shuffle_files=p.shuffle_buffer_size > 0)
    self._CheckFeatures(self.DatasetInfo().features)
    return dataset

  def _CheckFeatures(self, features: Any) -> None:
    """Raises if the dataset lacks what Preprocess reads; default: nothing."""
    del features  # Unused.

  def _RequireFeatures(self, features: Any, *param_names: str) -> None:
    """Fails unless each p.<name>'s value is a feature of the dataset."""
    p = self._params
    for name in param_names:
      key = p.Get(name)
      if key not in features:
        self._Fail(f'dataset {p.dataset_name!r} has no feature {key!r} '
                   f'(features: {sorted(features.keys())}); set p.{name}.')

  def DatasetInfo(self) -> Optional[tfds.core.DatasetInfo]:
    """TFDS's info of the dataset (features, splits); loads it if needed.

    None if `_LoadExamples` is overridden and does not use TFDS.
    """
    if self._info is None:
      self._LoadExamples()
    return self._info

  def NumExamples(self) -> Optional[int]:
    """Examples per epoch before batching, or None if TFDS does not know."""
    p = self._params
    info = self.DatasetInfo()
    if info is None:
      return None
    try:
      n = info.splits[p.split].num_examples
    except (KeyError, ValueError):
      return None
    if not n:
      return None
    return n if p.num_examples < 0 else min(n, p.num_examples)

  # ---- the pipeline -------------------------------------------------

  def Preprocess(self, example: Dict[str, Any], seed: tf.Tensor) -> NestedMap:
    """One example's features -> NestedMap of tensors with fixed shapes.

    Args:
      example: the TFDS features of one example (a dict of tensors).
      seed: int64 [2], unique to this example and deterministic given
        p.seed: pass it to stateless random ops (tf.random.stateless_*,
        tf.image.stateless_*).

    Returns:
      The example as a NestedMap. This default converts the features as they
      are; subclasses override it.
    """
    del seed  # Unused.
    return _ToNestedMap(example)

  def GetDataset(self) -> tf.data.Dataset:
    """The batched dataset of NestedMaps (module docstring), static shapes."""
    p = self._params
    dataset = self._LoadExamples()
    if p.num_examples >= 0:
      dataset = dataset.take(p.num_examples)
    if p.shuffle_buffer_size > 0:
      dataset = dataset.shuffle(p.shuffle_buffer_size, seed=p.seed,
                                reshuffle_each_iteration=True)
    if p.repeat:
      dataset = dataset.repeat()
    base_seed = tf.constant(p.seed, tf.int64)

    def _Map(index: tf.Tensor, example: Dict[str, Any]) -> NestedMap:
      return self.Preprocess(example, tf.stack([base_seed, index]))

    # tf.data would run _Map through AutoGraph; like every function here it
    # is plain Python over TF ops (docs/DESIGN.md section 1).
    dataset = dataset.enumerate().map(
        tf.autograph.experimental.do_not_convert(_Map),
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    dataset = self._Batch(dataset)
    if p.prefetch:
      dataset = dataset.prefetch(tf.data.AUTOTUNE)
    return dataset

  def _Batch(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
    """Batches of p.batch_size with static shapes; subclasses may batch
    otherwise (MTInput's length buckets)."""
    dataset = dataset.batch(self._params.batch_size, drop_remainder=True)
    self._CheckStaticShapes(dataset.element_spec)
    return dataset

  def InputBatchSpec(self) -> NestedMap:
    """NestedMap of tf.TensorSpec of one batch (builds the dataset)."""
    return self.GetDataset().element_spec

  def _CheckStaticShapes(self, spec: Any) -> None:
    for path, leaf in NestedMap(batch=spec).FlattenItems():
      if not leaf.shape.is_fully_defined():
        self._Fail(f'Preprocess returned {path[len("batch."):]!r} of shape '
                   f'{leaf.shape[1:]}; pad or crop it to a fixed shape.')


# What a length-bucketed input's error says of a pair longer than its last
# bucket (MTInput's long_sentences='error'); the trainer finds the message
# by it and shows that alone.
LONG_PAIR_ERROR = 'is longer than the last length bucket'
# The batch key of the count of long pairs dropped so far (not the model's).
DROPPED_LONG = 'dropped_long'


def Buckets(p: hyperparams.Params) -> List[Tuple[int, int]]:
  """(bound, batch size) of each length bucket of an input's params
  (MTInput's bucket_upper_bound and bucket_batch_limit); [] without."""
  if 'bucket_upper_bound' not in p:
    return []
  return list(zip(p.bucket_upper_bound or [], p.bucket_batch_limit or []))


def LargestBucket(p: hyperparams.Params) -> Optional[Tuple[int, int]]:
  """(bound, batch size) of the bucket whose batch holds the most tokens
  (what the pipeline's partitions and plan are sized for); None without
  buckets."""
  buckets = Buckets(p)
  return max(buckets, key=lambda b: b[0] * b[1]) if buckets else None


def StepSpec(p: hyperparams.Params, dataset: tf.data.Dataset
             ) -> Optional[Any]:
  """For an input in length buckets (params `p`, its `dataset`), the
  spec a step function is traced for once, serving every bucket (docs/
  DESIGN.md section 38): the batches' spec, unknown on the axes the
  buckets vary (batch, time), without the count of dropped pairs the
  model does not see. None without buckets: each shape is traced as it
  comes, with every axis known."""
  if not Buckets(p):
    return None
  spec = dataset.element_spec
  return type(spec)((k, v) for k, v in spec.items() if k != DROPPED_LONG)


def _ToNestedMap(value: Any) -> Any:
  """Dicts (recursively) as NestedMaps; other values as they are."""
  if isinstance(value, dict):
    return NestedMap({k: _ToNestedMap(v) for k, v in value.items()})
  return value
