"""Load(path): the tokenizer a vocabulary file holds, whichever kind.

Word vocabularies (tokenizer.Tokenizer.Save: text, one token per line,
starting with '<pad>') and sentencepiece subword models
(subword.SubwordTokenizer.Save: a binary model) have the same interface:
VocabSize, Encode (a TF op) and Decode (ids to text).
"""

from __future__ import annotations

from typing import Union

import tensorflow as tf

from lingvo_pipe.tasks.mt import subword
from lingvo_pipe.tasks.mt import tokenizer

AnyTokenizer = Union[tokenizer.Tokenizer, subword.SubwordTokenizer]


def Load(path: str) -> AnyTokenizer:
  """The tokenizer saved at `path` (module docstring)."""
  head = (tokenizer.SPECIAL_TOKENS[0] + '\n').encode('utf-8')
  with tf.io.gfile.GFile(path, 'rb') as f:
    is_words = f.read(len(head)) == head
  if is_words:
    return tokenizer.Tokenizer.FromFile(path)
  return subword.SubwordTokenizer.FromFile(path)
