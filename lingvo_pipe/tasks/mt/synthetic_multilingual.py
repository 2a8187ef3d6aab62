"""lingvo_pipe_synthetic_multilingual: a made-up English and three languages.

A TFDS builder of parallel sentences, offline, shaped like a multi-way
corpus: each example holds one sentence per language, {'en', 'xx', 'yy',
'zz'}: Text. 'en' is synthetic_translation's source language (64 made-up
words, Zipf-like frequencies, 3 to 12 words). Each other language has its
own one-to-one word map into its own made-up words and its own word order:

  xx   its words, adjacent pairs swapped (synthetic_translation's rule)
  yy   its words, the sentence reversed
  zz   its words, in English order

so a multilingual model must learn six directions (English to each, each
to English) and tell them apart by the target-language token only
(Johnson et al. 2017; multilingual_input.py adds it). `Translate(en,
lang)` gives a sentence in any language.

Configs: 'default' (train 10000, validation 500, test 500 sentences per
language) and 'tiny' (300, 50, 50; for tests).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Dict, Iterator, List, Tuple

import numpy as np
import tensorflow_datasets as tfds

from lingvo_pipe.tasks.mt import synthetic_translation as st

NAME = 'lingvo_pipe_synthetic_multilingual'
ENGLISH = 'en'
LANGUAGES = ('xx', 'yy', 'zz')
_SEEDS = {'xx': 11, 'yy': 22, 'zz': 33}
_SPLIT_IDS = {'train': 0, 'validation': 1, 'test': 2}


@functools.lru_cache(maxsize=None)
def WordMap(language: str) -> Dict[str, str]:
  """English word -> the word of `language` (one-to-one)."""
  rng = np.random.default_rng([_SEEDS[language], 0])
  consonants, vowels = 'bdfgklmnprstvz', 'aeiou'
  if language == 'xx':  # vowel-consonant-any: 'abo', 'ekt'
    forms = [a + b + c for a, b, c in itertools.product(
        vowels, consonants, vowels + consonants)]
  elif language == 'yy':  # consonant-vowel-consonant: 'bak', 'tim'
    forms = [a + b + c for a, b, c in itertools.product(
        consonants, vowels, consonants)]
  else:  # consonant-consonant-vowel: 'tra', 'ski'
    forms = [a + b + c for a, b, c in itertools.product(
        consonants, consonants, vowels) if a != b]
  chosen = [forms[i] for i in rng.choice(len(forms), st.NUM_WORDS,
                                         replace=False)]
  return dict(zip(st.SourceWords(), chosen))


def Translate(english: str, language: str) -> str:
  """`english` in `language` (module docstring)."""
  if language == ENGLISH:
    return english
  words = [WordMap(language)[w] for w in english.split()]
  if language == 'xx':
    words = st.SwapAdjacentPairs(words)
  elif language == 'yy':
    words = words[::-1]
  return ' '.join(words)


def GenerateSplit(split: str, num_examples: int
                  ) -> Iterator[Tuple[int, Dict[str, str]]]:
  """Yields (key, {language: sentence}); example i depends on (split, i)."""
  words = st.SourceWords()
  weights = 1.0 / np.arange(1, st.NUM_WORDS + 1)
  weights /= weights.sum()
  for i in range(num_examples):
    rng = np.random.default_rng([7, _SPLIT_IDS[split], i])
    length = rng.integers(st.MIN_LENGTH, st.MAX_LENGTH + 1)
    english = ' '.join(words[j] for j in rng.choice(st.NUM_WORDS, length,
                                                    p=weights))
    yield i, {lang: Translate(english, lang)
              for lang in (ENGLISH,) + LANGUAGES}


def AllLanguages() -> List[str]:
  return [ENGLISH] + list(LANGUAGES)


@dataclasses.dataclass(eq=False)
class SyntheticMultilingualConfig(tfds.core.BuilderConfig):
  """Split sizes of a config."""
  num_train_examples: int = 10000
  num_validation_examples: int = 500
  num_test_examples: int = 500


class SyntheticMultilingual(tfds.core.GeneratorBasedBuilder):
  """TFDS builder of lingvo_pipe_synthetic_multilingual (module docstring)."""

  name = NAME
  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'First version.'}
  BUILDER_CONFIGS = [
      SyntheticMultilingualConfig(
          name='default', description='10000 train, 500 validation, 500 '
          'test.'),
      SyntheticMultilingualConfig(
          name='tiny', description='300 train, 50 validation, 50 test.',
          num_train_examples=300, num_validation_examples=50,
          num_test_examples=50),
  ]

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description='English and three made-up languages, word for word '
        'with their own word orders.',
        features=tfds.features.FeaturesDict(
            {lang: tfds.features.Text() for lang in AllLanguages()}))

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    del dl_manager  # Nothing to download.
    config = self.builder_config
    sizes = {'train': config.num_train_examples,
             'validation': config.num_validation_examples,
             'test': config.num_test_examples}
    return {split: GenerateSplit(split, n) for split, n in sizes.items()}

  def _generate_examples(self):  # Unused: _split_generators yields them.
    raise NotImplementedError
