"""Tokenizer: a word-level vocabulary, with encoding and decoding as TF ops.

Words are the whitespace-separated pieces of a sentence. Ids 0-3 are
special; the others are words, most frequent first:

  id  token    meaning
  0   <pad>    padding
  1   <s>      start of sentence (first decoder input)
  2   </s>     end of sentence
  3   <unk>    any word not in the vocabulary
  4.. words    sorted by count (descending), then alphabetically

The vocabulary file has one token per line (UTF-8), line i holding id i,
the four special tokens first.

`Encode` and `Decode` are TF ops (a `tf.lookup.StaticHashTable` and a
gather), so they run inside `tf.data` maps:

  tok = Tokenizer.FromTexts(['a b', 'b c'])
  tok.Encode('b a x')                # [4, 5, 3]: x is <unk>
  tok.Decode([1, 4, 5, 2, 0])        # b'b a': stops at </s>, drops <s>, pad

`Decode(Encode(s)) == s` for a sentence `s` of vocabulary words separated by
single spaces.
"""

from __future__ import annotations

import collections
import os
from typing import Iterable, List, Optional, Sequence, Union

import tensorflow as tf

PAD_ID = 0
SOS_ID = 1
EOS_ID = 2
UNK_ID = 3
SPECIAL_TOKENS = ('<pad>', '<s>', '</s>', '<unk>')

TextLike = Union[str, bytes]


class Tokenizer:
  """A word-level vocabulary (see the module docstring)."""

  PAD_ID = PAD_ID
  SOS_ID = SOS_ID
  EOS_ID = EOS_ID
  UNK_ID = UNK_ID

  def __init__(self, tokens: Sequence[str]) -> None:
    """`tokens[i]` is the token of id i; the first four are SPECIAL_TOKENS."""
    tokens = list(tokens)
    if tuple(tokens[:len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
      raise ValueError(f'A vocabulary starts with {list(SPECIAL_TOKENS)}; '
                       f'this one starts with {tokens[:4]}.')
    duplicates = sorted(t for t, n in collections.Counter(tokens).items()
                        if n > 1)
    if duplicates:
      raise ValueError(f'Vocabulary has duplicate tokens {duplicates[:5]}.')
    bad = [t for t in tokens if not t or len(t.split()) != 1 or t != t.strip()]
    if bad:
      raise ValueError(f'Vocabulary tokens must be non-empty and hold no '
                       f'whitespace; got {bad[:5]}.')
    self._tokens = tokens
    words = tokens[len(SPECIAL_TOKENS):]
    # The special tokens are not looked up: '<s>' in a text is <unk>.
    self._table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(
            tf.constant(words, tf.string),
            tf.range(len(SPECIAL_TOKENS), len(tokens), dtype=tf.int64)),
        default_value=UNK_ID)
    self._token_tensor = tf.constant(tokens, tf.string)

  # ---- building, saving, loading -------------------------------------

  @classmethod
  def FromTexts(cls, texts: Iterable[TextLike],
                max_vocab_size: Optional[int] = None) -> 'Tokenizer':
    """The vocabulary of the words in `texts`, most frequent first.

    Args:
      texts: sentences (str, or UTF-8 bytes as read from tf.data).
      max_vocab_size: keep the most frequent words so that VocabSize() is
        at most this (special tokens included); None keeps all of them.
    """
    counts = collections.Counter()
    for text in texts:
      if isinstance(text, str):
        text = text.encode('utf-8')
      counts.update(text.split())  # bytes.split: ASCII whitespace, as TF.
    words = sorted(counts, key=lambda w: (-counts[w], w))
    words = [w.decode('utf-8') for w in words]
    words = [w for w in words if w not in SPECIAL_TOKENS]
    if max_vocab_size is not None:
      if max_vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f'max_vocab_size is {max_vocab_size}; it must be '
                         f'more than the {len(SPECIAL_TOKENS)} special ids.')
      words = words[:max_vocab_size - len(SPECIAL_TOKENS)]
    return cls(list(SPECIAL_TOKENS) + words)

  @classmethod
  def FromFile(cls, path: str) -> 'Tokenizer':
    """Loads a vocabulary file (one token per line, id = line number)."""
    with tf.io.gfile.GFile(path, 'rb') as f:
      tokens = f.read().decode('utf-8').split('\n')
    if tokens and not tokens[-1]:
      tokens.pop()
    try:
      return cls(tokens)
    except ValueError as e:
      raise ValueError(f'Bad vocabulary file {path!r}: {e}') from None

  def Save(self, path: str) -> None:
    """Writes the vocabulary file atomically (a temp file, then a rename)."""
    directory = os.path.dirname(path)
    if directory:
      tf.io.gfile.makedirs(directory)
    tmp = f'{path}.tmp-{os.getpid()}'
    with tf.io.gfile.GFile(tmp, 'wb') as f:
      f.write(''.join(t + '\n' for t in self._tokens).encode('utf-8'))
    tf.io.gfile.rename(tmp, path, overwrite=True)

  # ---- queries -------------------------------------------------------

  def VocabSize(self) -> int:
    """Number of ids, special ones included."""
    return len(self._tokens)

  def Tokens(self) -> List[str]:
    """tokens[i] is the token of id i."""
    return list(self._tokens)

  def Encode(self, text: Union[TextLike, Sequence[TextLike], tf.Tensor]
             ) -> Union[tf.Tensor, tf.RaggedTensor]:
    """Word ids (int32), without <s> or </s>.

    Args:
      text: a string scalar, or a [batch] vector of strings.

    Returns:
      [num_words] int32 for a scalar; a [batch, (num_words)] int32
      RaggedTensor for a vector.
    """
    text = tf.convert_to_tensor(text, tf.string)
    words = tf.strings.split(text)
    if isinstance(words, tf.RaggedTensor):
      return tf.ragged.map_flat_values(self._Lookup, words)
    return self._Lookup(words)

  def _Lookup(self, words: tf.Tensor) -> tf.Tensor:
    return tf.cast(self._table.lookup(words), tf.int32)

  def Decode(self, ids: Union[Sequence, tf.Tensor, tf.RaggedTensor]
             ) -> tf.Tensor:
    """The sentence of `ids`: words joined by single spaces.

    Stops at the first </s>; drops <pad> and <s>; an id out of range reads
    as <unk>.

    Args:
      ids: [time] or [batch, time] ints, dense or ragged.

    Returns:
      A string scalar for [time], a [batch] string vector for [batch, time].
    """
    if isinstance(ids, tf.RaggedTensor):
      ids = ids.to_tensor(default_value=PAD_ID)
    ids = tf.cast(tf.convert_to_tensor(ids), tf.int32)
    ids = tf.where((ids < 0) | (ids >= self.VocabSize()), UNK_ID, ids)
    before_eos = tf.math.cumsum(tf.cast(ids == EOS_ID, tf.int32), axis=-1) == 0
    keep = before_eos & (ids != PAD_ID) & (ids != SOS_ID)
    words = tf.ragged.boolean_mask(tf.gather(self._token_tensor, ids), keep)
    return tf.strings.reduce_join(words, axis=-1, separator=' ')

