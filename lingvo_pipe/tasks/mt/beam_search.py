"""Beam search over a cached decoder step, with static shapes.

`BeamSearch(step_fn, cache, batch_size, beam_size, max_length, ...)`
keeps k = beam_size hypotheses per sentence. step_fn decodes one position
for all b * k hypotheses from their last tokens and a cache (each decoder
layer's keys and values so far, transformer_layers.ExtendStep), so a step
runs the decoder on one position instead of re-running it over the prefix:

  alive: k sequences [b, k, T], their log-probabilities (only beam 0 live
         at the start, its last token <s>)
  finished: the k best ended sequences and their scores
  for t in 0 .. T-1, while some sentence could still improve:
    log_p = step_fn(last tokens [b*k], t, cache)               [b*k, V]
    the 2k best (alive log-prob + log_p) of the k*V extensions
    those among the k best ending in </s> join finished with score
        log-prob / ((5 + length) / 6) ** alpha     (Wu et al. 2016, the
                                                   Transformer's alpha)
    the k best of the rest stay alive; the cache follows their beams
  each sentence's result: the best of its finished and, if the loop
  reached T, its alive hypotheses (scored at length T, unended)

2k extensions suffice: at most k of them end in </s> (one per beam);
counting an ending only among the k best (as fairseq does) makes beam size
1 exactly greedy search. A sentence is done when its best finished score
beats the best score any alive hypothesis could still reach (its
log-prob can only fall; at alpha >= 0 the kindest length is T). The loop
is one `tf.while_loop` (no AutoGraph): eager and inside
`tf.function(autograph=False)` alike.
"""

from __future__ import annotations

from typing import Any, Callable, Tuple

import tensorflow as tf

from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.tasks.mt import tokenizer

# (last tokens int32 [n], step int32 scalar, cache) -> (log-probabilities
# [n, V], the cache after the step); n = batch_size * beam_size.
StepFn = Callable[[tf.Tensor, tf.Tensor, Any], Tuple[tf.Tensor, Any]]

_NEG = -1e9  # a log-probability no hypothesis reaches


def LengthPenalty(length: Any, alpha: float) -> tf.Tensor:
  """((5 + length) / 6) ** alpha, float32 (Wu et al. 2016)."""
  return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


def _SetColumn(buffer: tf.Tensor, index: tf.Tensor,
               values: tf.Tensor) -> tf.Tensor:
  """buffer [b, k, T] with [:, :, index] set to values [b, k]."""
  at = tf.equal(tf.range(buffer.shape[-1]), index)
  return tf.where(at, values[..., tf.newaxis], buffer)


def _Gather(x: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
  """x [b, m, ...] -> [b, k, ...] at index [b, k] into axis 1."""
  return tf.gather(x, index, batch_dims=1)


def BeamSearch(step_fn: StepFn, cache: Any, batch_size: int, beam_size: int,
               max_length: int, length_alpha: float = 0.0,
               sos_id: int = tokenizer.SOS_ID,
               eos_id: int = tokenizer.EOS_ID,
               pad_id: int = tokenizer.PAD_ID) -> NestedMap:
  """The best hypothesis per sentence (module docstring).

  Args:
    step_fn: see StepFn; its rows are sentence-major (row i * k + j is
      beam j of sentence i).
    cache: a nest of tensors [b*k, ...] (already repeated k times per
      sentence, e.g. with tf.repeat(x, k, axis=0)); reordered with the
      beams after every step.
    batch_size: b, static.
    beam_size: k >= 1.
    max_length: T, the most tokens per hypothesis (</s> included).
    length_alpha: alpha of the length penalty; 0 ranks by log-probability.
    sos_id: the first decoder input.
    eos_id: ends a hypothesis; kept in the output.
    pad_id: fills a hypothesis after its </s>.

  Returns:
    NestedMap(ids int32 [b, T] (the tokens, </s>, then pad_id), lengths
    int32 [b] (tokens up to and including </s>; T if none), scores float32
    [b] (log-probability over the length penalty), log_probs float32 [b]).
  """
  b, k, t_max = batch_size, beam_size, max_length
  for name, value in (('beam_size', k), ('max_length', t_max)):
    if not isinstance(value, int) or value < 1:
      raise ValueError(f'BeamSearch: {name}={value!r} must be an int >= 1.')
  if length_alpha < 0:
    raise ValueError(f'BeamSearch: length_alpha={length_alpha} must be >= 0 '
                     '(the stopping rule assumes it).')
  pads = tf.fill([b, k, t_max], tf.constant(pad_id, tf.int32))
  first = tf.concat([tf.zeros([b, 1]), tf.fill([b, k - 1], _NEG)], axis=1)
  state = NestedMap(
      alive_ids=pads, alive_logp=first,
      last=tf.fill([b, k], tf.constant(sos_id, tf.int32)),
      fin_ids=pads, fin_scores=tf.fill([b, k], _NEG),
      fin_logp=tf.fill([b, k], _NEG),
      fin_lengths=tf.zeros([b, k], tf.int32))
  best_bound = lambda logp: logp / LengthPenalty(t_max, length_alpha)  # noqa: E731

  def Cond(i, state, unused_cache):
    could_improve = best_bound(state.alive_logp[:, 0]) > state.fin_scores[:,
                                                                         0]
    return tf.logical_and(i < t_max, tf.reduce_any(could_improve))

  def Body(i, state, cache):
    logp, cache = step_fn(tf.reshape(state.last, [b * k]), i, cache)
    vocab = logp.shape[-1]
    total = state.alive_logp[:, :, tf.newaxis] + tf.reshape(
        tf.cast(logp, tf.float32), [b, k, vocab])
    top_logp, top_index = tf.math.top_k(tf.reshape(total, [b, k * vocab]),
                                        2 * k)
    beam, token = top_index // vocab, top_index % vocab
    seqs = _SetColumn(_Gather(state.alive_ids, beam), i, token)
    ended = tf.equal(token, eos_id)
    # The k best that go on.
    alive_logp, pick = tf.math.top_k(tf.where(ended, _NEG, top_logp), k)
    rows = _Gather(beam, pick) + tf.range(b)[:, tf.newaxis] * k
    cache = tf.nest.map_structure(
        lambda x: tf.gather(x, tf.reshape(rows, [b * k])), cache)
    # The k best that ended, old and new; an ending counts only among the
    # step's k best extensions (so beam size 1 is greedy search).
    ended = tf.logical_and(ended, tf.range(2 * k) < k)
    new_scores = tf.where(ended, top_logp / LengthPenalty(i + 1,
                                                          length_alpha),
                          _NEG)
    scores = tf.concat([state.fin_scores, new_scores], axis=1)
    fin_scores, keep = tf.math.top_k(scores, k)
    new_lengths = tf.fill([b, 2 * k], i + 1)
    state = NestedMap(
        alive_ids=_Gather(seqs, pick), alive_logp=alive_logp,
        last=_Gather(token, pick), fin_scores=fin_scores,
        fin_ids=_Gather(tf.concat([state.fin_ids, seqs], 1), keep),
        fin_logp=_Gather(tf.concat([state.fin_logp, top_logp], 1), keep),
        fin_lengths=_Gather(tf.concat([state.fin_lengths, new_lengths], 1),
                            keep))
    return i + 1, state, cache

  _, state, _ = tf.while_loop(Cond, Body, (tf.constant(0), state, cache),
                              maximum_iterations=t_max)
  # Hypotheses still alive at the limit compete as they are (length T).
  # If the loop stopped earlier, no alive score can beat the finished one.
  alive_score = best_bound(state.alive_logp[:, 0])
  finished = alive_score <= state.fin_scores[:, 0]
  return NestedMap(
      ids=tf.where(finished[:, tf.newaxis], state.fin_ids[:, 0],
                   state.alive_ids[:, 0]),
      lengths=tf.where(finished, state.fin_lengths[:, 0], t_max),
      scores=tf.where(finished, state.fin_scores[:, 0], alive_score),
      log_probs=tf.where(finished, state.fin_logp[:, 0],
                         state.alive_logp[:, 0]))
