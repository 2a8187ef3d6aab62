"""Greedy decoding without a cache: re-run the decoder on the prefix.

Decoding uses beam_search.py (cached: one position per step); this search,
which re-runs the decoder over the prefix at every step, stays as its
reference, in tests and bench/decode.

`GreedyDecodeUncached(logits_fn, batch_size, max_length, ...)` keeps the
decoder inputs in one [b, T] buffer (T = max_length) and, at every step,
runs the whole decoder over it. The decoder is causal, so the logits at
position i depend only on inputs[:, :i+1], the prefix decoded so far; what
sits after it (padding) cannot leak in:

  inputs = [<s>, <pad>, ..., <pad>]                       [b, T]
  for i in 0 .. T-1, while some row has not emitted </s>:
    logits = logits_fn(inputs)                           [b, T, V]
    token = argmax(logits[:, i])                          [b]
    token = <pad> where the row already emitted </s>
    out[:, i] = token;  inputs[:, i+1] = token
    score += log_softmax(logits[:, i])[token]   (rows not yet done)

That is O(T^2) decoder positions instead of O(T) with a cache; every
shape is static and the loop is a `tf.while_loop` (plain TF, no AutoGraph):
the graph holds one copy of the decoder whatever T is. It runs the same
eagerly and inside `tf.function(autograph=False)`.

`TrimIds` turns decoded or reference rows into token lists (numpy), for
the metrics.
"""

from __future__ import annotations

from typing import Callable, List, Sequence

import numpy as np
import tensorflow as tf

from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.tasks.mt import tokenizer

LogitsFn = Callable[[tf.Tensor], tf.Tensor]


def _SetColumn(buffer: tf.Tensor, index: tf.Tensor,
               values: tf.Tensor) -> tf.Tensor:
  """buffer [b, T] with column `index` set to values [b] (no-op if >= T)."""
  length = buffer.shape[1]
  at = tf.equal(tf.range(length), index)[tf.newaxis, :]
  return tf.where(at, values[:, tf.newaxis], buffer)


def GreedyDecodeUncached(logits_fn: LogitsFn, batch_size: int, max_length: int,
                 sos_id: int = tokenizer.SOS_ID,
                 eos_id: int = tokenizer.EOS_ID,
                 pad_id: int = tokenizer.PAD_ID,
                 score_dtype: tf.DType = tf.float32) -> NestedMap:
  """Greedy search (module docstring).

  Args:
    logits_fn: decoder inputs int32 [b, T] -> logits [b, T, V]; position i
      must depend only on inputs[:, :i+1] (a causal decoder).
    batch_size: b, static.
    max_length: T, the most tokens decoded per row (</s> included).
    sos_id: the first decoder input.
    eos_id: ends a row; it is kept in the output.
    pad_id: fills a row after its </s>.
    score_dtype: dtype of the scores (log-probabilities are cast to it).

  Returns:
    NestedMap(ids int32 [b, T]: the tokens, </s> then pad_id;
              lengths int32 [b]: tokens up to and including </s> (T if
                none);
              scores score_dtype [b]: the sum of the chosen tokens'
                log-probabilities).
  """
  if not isinstance(max_length, int) or max_length < 1:
    raise ValueError(
        f'GreedyDecodeUncached: max_length={max_length!r} must be an int >= 1.')
  b, t = batch_size, max_length
  inputs = tf.fill([b, t], tf.constant(pad_id, tf.int32))
  inputs = _SetColumn(inputs, tf.constant(0), tf.fill([b], sos_id))
  ids = tf.fill([b, t], tf.constant(pad_id, tf.int32))
  done = tf.zeros([b], tf.bool)
  scores = tf.zeros([b], score_dtype)

  def Cond(i, unused_inputs, unused_ids, done, unused_scores):
    return tf.logical_and(i < t, tf.logical_not(tf.reduce_all(done)))

  def Body(i, inputs, ids, done, scores):
    logits = tf.gather(logits_fn(inputs), i, axis=1)             # [b, V]
    log_probs = tf.nn.log_softmax(logits)
    token = tf.argmax(logits, axis=-1, output_type=tf.int32)
    token = tf.where(done, tf.constant(pad_id, tf.int32), token)
    picked = tf.cast(tf.gather(log_probs, token, batch_dims=1), score_dtype)
    scores += tf.where(done, tf.zeros_like(picked), picked)
    ids = _SetColumn(ids, i, token)
    inputs = _SetColumn(inputs, i + 1, token)
    done = tf.logical_or(done, tf.equal(token, eos_id))
    return i + 1, inputs, ids, done, scores

  _, _, ids, done, scores = tf.while_loop(
      Cond, Body, (tf.constant(0), inputs, ids, done, scores),
      maximum_iterations=t)
  is_eos = tf.cast(tf.equal(ids, eos_id), tf.int32)
  before = tf.cast(tf.equal(tf.cumsum(is_eos, axis=1, exclusive=True), 0),
                   tf.int32)
  return NestedMap(ids=ids, lengths=tf.reduce_sum(before, axis=1),
                   scores=scores)


def TrimIds(ids: Sequence[int], eos_id: int = tokenizer.EOS_ID,
            pad_id: int = tokenizer.PAD_ID,
            sos_id: int = tokenizer.SOS_ID) -> List[int]:
  """The tokens of one row before its first </s>, without <pad> or <s>."""
  out = []
  for token in np.asarray(ids).tolist():
    if token == eos_id:
      break
    if token not in (pad_id, sos_id):
      out.append(int(token))
  return out
