"""MultilingualMTInput: several language pairs in one stream, one vocabulary.

One model translates between many languages when each source sentence
starts with a token naming the target language (Johnson et al. 2017):

  pairs = [(None, 'en', 'xx', 1.0), (None, 'xx', 'en', 1.0),
           ('wmt14_translate/de-en', 'en', 'de', 2.0)]
  p = MultilingualMTInput.Params().Set(
      dataset_name='lingvo_pipe_synthetic_multilingual', pairs=pairs, ...)

Pair i = (dataset or None for p.dataset_name, source feature, target
feature, sampling weight) reads `dataset`'s split and becomes

  src: '<2{target}> ' + example[source]     tgt: example[target]
  pair: i   (an int32 per example, kept in the batch: per-pair BLEU)

Examples are drawn from the pairs' streams with the weights normalised
(tf.data's sample_from_datasets, seeded: the same mix every time); for
training the streams repeat, for evaluation each is read in full, the
pairs interleaved, so any number of eval batches covers every pair. The batches
are MTInput's plus `pair` [b]. One vocabulary serves every language: it
is built from every pair's sentences of p.vocab_split (language tokens
included, each one piece in a subword vocabulary). p.source_key and
p.target_key are 'src' and 'tgt', the mixed stream's.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Dict, Iterator, List, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core import hyperparams
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.tasks.mt import input_generator
from lingvo_pipe.tasks.mt import synthetic_multilingual

Pair = Tuple[Any, str, str, float]


def LanguageToken(language: str) -> str:
  """The token that asks for `language`: '<2xx>'."""
  return f'<2{language}>'


def PairName(pair: Sequence[Any]) -> str:
  """'en-xx' for a pair (dataset, 'en', 'xx', weight)."""
  return f'{pair[1]}-{pair[2]}'


class MultilingualMTInput(input_generator.MTInput):
  """Several language pairs mixed (module docstring)."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.dataset_name = synthetic_multilingual.NAME
    p.Define('pairs', [],
             '(dataset or None for dataset_name, source feature, target '
             'feature, sampling weight) per language pair.')
    return p

  def _CheckParams(self) -> None:
    super()._CheckParams()
    p = self.params
    if not p.pairs:
      self._Fail('p.pairs is empty; list (dataset, source, target, weight) '
                 "tuples, e.g. (None, 'en', 'xx', 1.0).")
    for pair in p.pairs:
      if len(pair) != 4 or not pair[3] > 0:
        self._Fail(f'p.pairs has {pair!r}; each pair is (dataset or None, '
                   'source feature, target feature, weight > 0).')
    names = [PairName(pair) for pair in p.pairs]
    if len(set(names)) != len(names):
      self._Fail(f'p.pairs repeats a language pair: {names}.')
    if (p.source_key, p.target_key) != ('src', 'tgt'):
      self._Fail("p.source_key and p.target_key must stay 'src' and 'tgt' "
                 '(the mixed stream\'s); the pairs name the features.')

  def PairNames(self) -> List[str]:
    return [PairName(pair) for pair in self.params.pairs]

  def VocabFile(self) -> str:
    """p.vocab_file, or a cache file named after every pair's source."""
    p = self.params
    if p.vocab_file:
      return p.vocab_file
    sources = repr([(d or p.dataset_name, s, t) for d, s, t, _ in p.pairs])
    digest = hashlib.sha256(sources.encode()).hexdigest()[:12]
    return re.sub(r'\.txt$', f'.{digest}.txt', super().VocabFile())

  def UserSymbols(self) -> List[str]:
    return sorted({LanguageToken(pair[2]) for pair in self.params.pairs})

  def _Pair(self, index: int, split: str, shuffle_files: bool
            ) -> tf.data.Dataset:
    """Pair `index`'s split as {'src', 'tgt', 'pair'} examples."""
    dataset_name, source, target, _ = self.params.pairs[index]
    dataset = self._LoadSplit(split, shuffle_files, dataset_name)
    missing = {source, target} - set(self.DatasetInfo().features.keys())
    if missing:
      self._Fail(f'pair {PairName(self.params.pairs[index])!r}: the dataset '
                 f'has no feature {sorted(missing)}; it has '
                 f'{sorted(self.DatasetInfo().features.keys())}.')
    token = tf.constant(LanguageToken(target) + ' ')

    def Map(example: Dict[str, Any]) -> Dict[str, tf.Tensor]:
      return {'src': tf.strings.join([token, example[source]]),
              'tgt': example[target],
              'pair': tf.constant(index, tf.int32)}

    return dataset.map(tf.autograph.experimental.do_not_convert(Map))

  def _LoadExamples(self) -> tf.data.Dataset:
    p = self.params
    shuffle = p.shuffle_buffer_size > 0
    streams = [self._Pair(i, p.split, shuffle) for i in range(len(p.pairs))]
    if p.repeat:
      streams = [s.repeat() for s in streams]
    total = float(sum(pair[3] for pair in p.pairs))
    # Seeded: the same mix every time. Evaluation's finite streams end
    # when all of them have (each read in full).
    return tf.data.Dataset.sample_from_datasets(
        streams, weights=[pair[3] / total for pair in p.pairs], seed=p.seed,
        stop_on_empty_dataset=False)

  def _Texts(self) -> Iterator[bytes]:
    p = self.params
    for i in range(len(p.pairs)):
      for example in self._Pair(i, p.vocab_split, False).as_numpy_iterator():
        yield example['src']
        yield example['tgt']

  def NumExamples(self) -> Any:
    return None  # Several datasets: TFDS's count of one would mislead.

  def Preprocess(self, example: Dict[str, Any], seed: tf.Tensor) -> NestedMap:
    out = super().Preprocess(example, seed)
    out.pair = example['pair']
    return out
