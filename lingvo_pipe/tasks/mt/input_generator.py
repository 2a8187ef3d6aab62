"""MTInput: sentence pairs as padded id sequences of a fixed length.

  p = MTInput.Params().Set(
      dataset_name='wmt14_translate/de-en', source_key='de', target_key='en',
      split='train', batch_size=64, max_length=64, repeat=True,
      shuffle_buffer_size=10000, seed=1)
  inp = p.Instantiate()
  inp.tokenizer.VocabSize()     # for the model's embeddings and softmax

Each batch is a NestedMap (t = max_length, Lingvo's conventions):

  src.ids       int32 [b, t]   tokens + </s>, then <pad>
  src.paddings  float32 [b, t] 1.0 at padded positions, else 0.0
  tgt.ids       int32 [b, t]   <s> + tokens: the decoder's inputs
  tgt.labels    int32 [b, t]   tokens + </s>: what the decoder predicts
  tgt.paddings  float32 [b, t]
  tgt.weights   float32 [b, t] 1 - paddings

A sentence longer than max_length - 1 words is truncated so that the </s>
(and <s>) still fit.

Length buckets (Lingvo's): with p.bucket_upper_bound = [8, 16, ...] a pair
goes to the first bucket at least as long as its longer side (</s> or <s>
included), is padded to that bound, and batched with p.bucket_batch_limit
of its bucket's pairs (tf.data's bucket_by_sequence_length); t is then
the bucket's bound. Nothing is truncated: a pair longer than the last
bound is dropped (p.long_sentences = 'drop', counted in each batch's
`dropped_long`: pairs dropped so far) or stops the input ('error').
`TokensPerBatch` fills the limits from a token budget. Each limit must be
a multiple of the pipeline's micro-batches (the trainer checks). A split
read once (p.repeat False: evaluation, decoding) keeps every pair: each
bucket's last batch is filled up to its limit with rows of padding, and
`index` int64 [b] says each row's place in the split (-1: a filler), so
the decoder writes its output in the split's order.

One vocabulary serves both sides: words (tokenizer.py) or sentencepiece
subwords (subword.py), as p.tokenizer says. It is read from
p.vocab_file if that exists, else built from p.vocab_split (both sides)
and written there; with p.vocab_file None, the file is
<data_dir>/lingvo_pipe_vocab/<dataset>.<split>.<src>-<tgt>.<max
size>.<tokenizer>.txt.
The trainer sets it to <logdir>/vocab.txt, so every job of a run reads the
vocabulary the first one built. Delete the file to rebuild it.

Importing this module registers lingvo_pipe_synthetic_translation with TFDS.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, Iterator, List, Optional, Tuple

from absl import logging
import tensorflow as tf
import tensorflow_datasets as tfds

from lingvo_pipe.core import base_input_generator
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.tasks.mt import subword
from lingvo_pipe.tasks.mt import synthetic_translation
from lingvo_pipe.tasks.mt import tokenizer as tokenizer_lib
from lingvo_pipe.tasks.mt import vocabulary

TOKENIZERS = ('word', 'subword')
LONG_SENTENCES = ('drop', 'error')
LONG_PAIR_ERROR = base_input_generator.LONG_PAIR_ERROR


def TokensPerBatch(bounds: List[int], tokens: int,
                   multiple_of: int = 1) -> List[int]:
  """bucket_batch_limit for `bounds` holding about `tokens` per batch:
  each bucket's pairs, tokens // bound rounded down to a multiple of
  `multiple_of` (a pipeline's micro-batches times replicas), at least one
  multiple."""
  if multiple_of < 1 or tokens < 1:
    raise ValueError(f'TokensPerBatch: tokens={tokens}, multiple_of='
                     f'{multiple_of}; use positive integers.')
  return [max(multiple_of, tokens // b // multiple_of * multiple_of)
          for b in bounds]


class MTInput(base_input_generator.BaseInputGenerator):
  """Source and target sentences of a TFDS translation dataset."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.dataset_name = synthetic_translation.NAME
    p.Define('source_key', synthetic_translation.SOURCE_KEY,
             "Feature holding the source sentence (e.g. 'de' in "
             'wmt14_translate/de-en).')
    p.Define('target_key', synthetic_translation.TARGET_KEY,
             "Feature holding the target sentence (e.g. 'en').")
    p.Define('max_length', 32,
             'Length of every id sequence: longer sentences are truncated, '
             'shorter ones padded.')
    p.Define('vocab_file', None,
             'Vocabulary file (tokenizer.py format), read if it exists, '
             'else built from vocab_split and written there; None: under '
             'data_dir (the trainer puts it in the logdir).')
    p.Define('vocab_split', 'train',
             'Split the vocabulary is built from when vocab_file is None.')
    p.Define('max_vocab_size', 32000,
             'Most ids a built vocabulary has (special ids included); None '
             'keeps every word (word vocabularies only).')
    p.Define('bucket_upper_bound', [],
             'Length buckets: the longest pair (tokens of its longer side, '
             '</s> or <s> included) of each, increasing; [] pads every '
             'batch to max_length (module docstring).')
    p.Define('bucket_batch_limit', [],
             'Pairs per batch of each bucket (TokensPerBatch fills it from '
             'a token budget); batch_size is then unused.')
    p.Define('long_sentences', 'drop',
             "A pair longer than the last bucket: 'drop' it (counted) or "
             "'error' (stops the input).")
    p.Define('tokenizer', 'word',
             f'What a built vocabulary holds: one of {TOKENIZERS} (words, '
             'or sentencepiece subwords: subword.py).')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    self._tokenizer: Optional[tokenizer_lib.Tokenizer] = None

  def _CheckParams(self) -> None:
    super()._CheckParams()
    p = self.params
    if not isinstance(p.max_length, int) or p.max_length < 2:
      self._Fail(f'p.max_length is {p.max_length!r}; set an int >= 2 (room '
                 'for a word and </s>).')
    if p.tokenizer not in TOKENIZERS:
      self._Fail(f'p.tokenizer is {p.tokenizer!r}; use one of {TOKENIZERS}.')
    bounds, limits = p.bucket_upper_bound, p.bucket_batch_limit
    if bounds or limits:
      if len(bounds) != len(limits):
        self._Fail(f'p.bucket_upper_bound has {len(bounds)} bounds and '
                   f'p.bucket_batch_limit {len(limits)} limits; give one '
                   'limit per bucket.')
      if not all(isinstance(b, int) and b >= 2 for b in bounds) or any(
          a >= b for a, b in zip(bounds, bounds[1:])):
        self._Fail(f'p.bucket_upper_bound is {bounds}; use increasing '
                   'ints >= 2.')
      if not all(isinstance(n, int) and n >= 1 for n in limits):
        self._Fail(f'p.bucket_batch_limit is {limits}; use ints >= 1.')
    if p.long_sentences not in LONG_SENTENCES:
      self._Fail(f'p.long_sentences is {p.long_sentences!r}; use one of '
                 f'{LONG_SENTENCES}.')
    if p.tokenizer == 'subword' and not isinstance(p.max_vocab_size, int):
      self._Fail('p.max_vocab_size is None; a subword vocabulary needs a '
                 'size (e.g. 32000).')

  @property
  def tokenizer(self) -> tokenizer_lib.Tokenizer:
    """The vocabulary of both sides (loaded or built on first use)."""
    if self._tokenizer is None:
      self._tokenizer = self._MakeTokenizer()
    return self._tokenizer

  def VocabFile(self) -> str:
    """p.vocab_file, or where the built vocabulary is cached."""
    p = self.params
    if p.vocab_file:
      return p.vocab_file
    name = '.'.join([p.dataset_name, p.vocab_split,
                     f'{p.source_key}-{p.target_key}',
                     str(p.max_vocab_size), p.tokenizer, 'txt'])
    name = re.sub(r'[^A-Za-z0-9_.+-]', '_', name)
    data_dir = p.data_dir or tfds.core.constants.DATA_DIR
    return os.path.join(os.fspath(data_dir), 'lingvo_pipe_vocab', name)

  def _MakeTokenizer(self) -> tokenizer_lib.Tokenizer:
    p = self.params
    path = self.VocabFile()
    if tf.io.gfile.exists(path):
      return vocabulary.Load(path)
    if p.tokenizer == 'subword':
      tokenizer = subword.SubwordTokenizer.FromTexts(
          self._Texts(), vocab_size=p.max_vocab_size,
          user_symbols=self.UserSymbols())
    else:
      tokenizer = tokenizer_lib.Tokenizer.FromTexts(
          self._Texts(), max_vocab_size=p.max_vocab_size)
    tokenizer.Save(path)
    logging.info('Built a vocabulary of %d ids from %s %s into %s.',
                 tokenizer.VocabSize(), p.dataset_name, p.vocab_split, path)
    return tokenizer

  def UserSymbols(self) -> List[str]:
    """Tokens a subword vocabulary must keep whole; none here."""
    return []

  def _Texts(self) -> Iterator[bytes]:
    """Both sentences of every example of p.vocab_split."""
    p = self.params
    dataset = self._LoadSplit(p.vocab_split, shuffle_files=False)
    self._CheckFeatures(self.DatasetInfo().features)
    for example in dataset.as_numpy_iterator():
      yield example[p.source_key]
      yield example[p.target_key]

  def _CheckFeatures(self, features: Any) -> None:
    self._RequireFeatures(features, 'source_key', 'target_key')

  def GetDataset(self) -> tf.data.Dataset:
    _ = self.tokenizer  # Build or load it outside of tf.data's tracing.
    return super().GetDataset()

  def Preprocess(self, example: Dict[str, Any], seed: tf.Tensor) -> NestedMap:
    """The pair's ids (module docstring); seed[1], the example's place in
    the split, is a bucketed evaluation batch's `index`."""
    p = self.params
    tok = self.tokenizer
    length = p.max_length
    src = tok.Encode(example[p.source_key])
    tgt = tok.Encode(example[p.target_key])
    eos = tf.constant([tok.EOS_ID], tf.int32)
    sos = tf.constant([tok.SOS_ID], tf.int32)
    if p.bucket_upper_bound:  # padded in _Batch, to the bucket's bound
      ids, labels = tf.concat([sos, tgt], 0), tf.concat([tgt, eos], 0)
      out = NestedMap(
          src=NestedMap(ids=tf.concat([src, eos], 0),
                        paddings=tf.zeros([tf.size(src) + 1])),
          tgt=NestedMap(ids=ids, labels=labels,
                        paddings=tf.zeros([tf.size(ids)]),
                        weights=tf.ones([tf.size(ids)])))
      if not p.repeat:  # the pair's place in the split (-1: a filler row)
        out.index = seed[1]
      return out
    src, tgt = src[:length - 1], tgt[:length - 1]
    src_ids, src_paddings = _PadTo(tf.concat([src, eos], 0), length)
    tgt_ids, tgt_paddings = _PadTo(tf.concat([sos, tgt], 0), length)
    tgt_labels, _ = _PadTo(tf.concat([tgt, eos], 0), length)
    return NestedMap(
        src=NestedMap(ids=src_ids, paddings=src_paddings),
        tgt=NestedMap(ids=tgt_ids, labels=tgt_labels, paddings=tgt_paddings,
                      weights=1.0 - tgt_paddings))


  def _Batch(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
    p = self.params
    if not p.bucket_upper_bound:
      return super()._Batch(dataset)
    bounds = p.bucket_upper_bound

    def Length(ex: NestedMap) -> tf.Tensor:
      return tf.maximum(tf.size(ex.src.ids), tf.size(ex.tgt.ids))

    def Count(dropped: tf.Tensor, ex: NestedMap
              ) -> Tuple[tf.Tensor, NestedMap]:
      long = Length(ex) > bounds[-1]
      if p.long_sentences == 'error':
        check = tf.debugging.Assert(tf.logical_not(long), [
            f'{p.name}: a pair of', Length(ex),
            f'tokens {LONG_PAIR_ERROR} ({bounds[-1]}); raise '
            "bucket_upper_bound or set long_sentences='drop'."],
            summarize=1)
        with tf.control_dependencies([check]):
          long = tf.identity(long)
      dropped += tf.cast(long, tf.int64)
      out = NestedMap(ex, long=long)
      out[base_input_generator.DROPPED_LONG] = dropped
      return dropped, out

    # The count is scan state: an iterator's checkpoint holds it.
    dataset = dataset.scan(tf.constant(0, tf.int64),
                           tf.autograph.experimental.do_not_convert(Count))
    dataset = dataset.filter(
        tf.autograph.experimental.do_not_convert(lambda ex: ~ex.long))
    dataset = dataset.map(tf.autograph.experimental.do_not_convert(
        lambda ex: NestedMap({k: v for k, v in ex.items() if k != 'long'})))
    pad = tokenizer_lib.PAD_ID
    values = tf.nest.map_structure(lambda spec: tf.constant(0, spec.dtype),
                                   dataset.element_spec)
    values.src.paddings = tf.constant(1.0)
    values.tgt.paddings = tf.constant(1.0)
    values.src.ids = values.tgt.ids = values.tgt.labels = tf.constant(pad)
    if 'index' in values:
      values.index = tf.constant(-1, tf.int64)
    dataset = dataset.bucket_by_sequence_length(
        tf.autograph.experimental.do_not_convert(Length),
        [b + 1 for b in bounds],
        list(p.bucket_batch_limit) + [1], padding_values=values,
        pad_to_bucket_boundary=True, drop_remainder=p.repeat)
    if p.repeat:
      return dataset
    # A split read once: each bucket's last batch is filled up to the
    # bucket's limit with rows of padding (index -1, weights 0), so every
    # pair is evaluated and every batch splits into the micro-batches.
    limits = tf.constant(p.bucket_batch_limit)
    bound_list = tf.constant(bounds)

    def Fill(batch: NestedMap) -> NestedMap:
      t = tf.shape(batch.src.ids)[1]
      bucket = tf.argmax(tf.cast(bound_list >= t, tf.int32))
      rows = tf.gather(limits, bucket) - tf.shape(batch.src.ids)[0]
      return tf.nest.map_structure(
          lambda x, value: tf.pad(
              x, [[0, rows]] + [[0, 0]] * (x.shape.rank - 1),
              constant_values=value), batch, values)

    return dataset.map(tf.autograph.experimental.do_not_convert(Fill))


def _PadTo(ids: tf.Tensor, length: int) -> Tuple[tf.Tensor, tf.Tensor]:
  """([length] ids padded with PAD_ID, [length] float32 paddings)."""
  n = tf.shape(ids)[0]
  padded = tf.pad(ids, [[0, length - n]], constant_values=tokenizer_lib.PAD_ID)
  paddings = 1.0 - tf.sequence_mask(n, length, tf.float32)
  return tf.ensure_shape(padded, [length]), paddings
