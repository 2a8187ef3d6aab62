"""TransformerMT: an encoder-decoder Transformer translation task.

  ComputePredictions(theta, batch):
    src = emb(src.ids) * sqrt(d) + positions, dropout            [b, s, d]
    tgt = emb(tgt.ids) * sqrt(d) + positions, dropout            [b, t, d]
    out = stack(NestedMap(vec=src, paddings, tgt_vec=tgt, tgt_paddings,
                          example_keys))                         [b, t, d]
    logits = out.vec @ emb^T                                     [b, t, V]
  ComputeLoss: label-smoothed cross-entropy, mean over non-padded target
    tokens; also log_pplx (without smoothing) and token_accuracy.
  Decode: beam search (beam_search.py) over cached decoder steps: the
    encoder runs once, each decoder layer keeps its keys and values, so a
    step runs the decoder on one position (its attention reads the cache)
    instead of re-running it over the whole prefix; every layer on its
    partition's device (no micro-batches). hyp_ids [b, T], ref_ids.

`stack` is the network of transformer.py: a PipeliningLayer over encoder,
switch and decoder layers (GPipe), or the same layers in a SequentialLayer.
The embedding table(s) and the tied softmax are outside it; embeddings are
computed on the stack's first device, logits on its last.

Decoder metrics: sacreBLEU (bleu.py) on text detokenised with the inputs'
vocabulary (p.vocab_file; without one, on id strings, not comparable with
anything) and the fraction of sentences decoded exactly. DecodeFinalize
writes the sources, hypotheses and references as text files and returns
the score with sacreBLEU's signature.

Batches are MTInput's (input_generator.py): src.ids, src.paddings, tgt.ids
(<s> first), tgt.labels (</s> last), tgt.paddings.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from lingvo_pipe.core import attention
from lingvo_pipe.core import base_layer
from lingvo_pipe.core import base_model
from lingvo_pipe.core import dropout
from lingvo_pipe.core import gpipe
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layers
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.tasks.mt import beam_search
from lingvo_pipe.tasks.mt import bleu
from lingvo_pipe.tasks.mt import decoder
from lingvo_pipe.tasks.mt import transformer
from lingvo_pipe.tasks.mt import vocabulary


class TransformerMT(base_model.BaseTask):
  """Encoder-decoder Transformer for translation (module docstring)."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('src_vocab_size', 0, 'Source ids.')
    p.Define('tgt_vocab_size', 0, 'Target ids (and softmax classes).')
    p.Define('shared_embedding', True,
             'One table for source, target and softmax (the vocab sizes '
             'must be equal); else a source table and a target table, the '
             'softmax tied to the target table.')
    p.Define('model_dim', 0, 'Model dimension d of the embeddings and stack.')
    p.Define('stack', None,
             'The network: transformer.PipelinedStack(...) or '
             'transformer.SequentialStack(...) params of '
             'transformer.TransformerLayers(...).')
    p.Define('input_dropout_prob', 0.0,
             'Dropout on the embeddings (with positions) of both sides.')
    p.Define('label_smoothing', 0.1, 'Label smoothing of the loss.')
    p.Define('max_decode_length', None,
             'Tokens decoded per sentence (</s> included); None: the '
             "batch's target length.")
    p.Define('beam_size', 4, 'Hypotheses kept per sentence; 1 is greedy '
             '(with length_alpha 0).')
    p.Define('length_alpha', 0.6,
             'Length normalisation: scores are log-probability / ((5 + '
             'length) / 6) ** alpha (0.6 in the Transformer paper).')
    p.Define('vocab_file', None,
             "The inputs' vocabulary file (vocabulary.Load): decoding "
             'detokenises with it for BLEU; None scores id strings.')
    p.Define('pair_names', [],
             "Language pairs ('en-xx', ...) of a multilingual input, in its "
             "order: the decoder reports BLEU per pair (batches' `pair`).")
    p.Define('decode_cache', True,
             'Decode with cached keys and values (one position per step); '
             'False re-runs the decoder over the prefix at every step '
             '(greedy only; for comparisons).')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    where = f"TransformerMT '{self.path}'"
    for key in ('src_vocab_size', 'tgt_vocab_size', 'model_dim'):
      if not isinstance(p.Get(key), int) or p.Get(key) <= 0:
        raise ValueError(f'{where}: {key}={p.Get(key)!r} must be a positive '
                         'int.')
    if p.shared_embedding and p.src_vocab_size != p.tgt_vocab_size:
      raise ValueError(
          f'{where}: shared_embedding needs src_vocab_size '
          f'({p.src_vocab_size}) == tgt_vocab_size ({p.tgt_vocab_size}); '
          'make them equal or set shared_embedding=False.')
    if p.stack is None:
      raise ValueError(
          f'{where}: set p.stack, e.g. transformer.PipelinedStack('
          'transformer.TransformerLayers(...), num_partitions, '
          'num_micro_batches).')
    if not 0.0 <= p.label_smoothing < 1.0:
      raise ValueError(
          f'{where}: label_smoothing={p.label_smoothing} must be in [0, 1).')
    if p.max_decode_length is not None and p.max_decode_length < 1:
      raise ValueError(
          f'{where}: max_decode_length={p.max_decode_length} must be >= 1 '
          'or None.')
    if not isinstance(p.beam_size, int) or p.beam_size < 1:
      raise ValueError(f'{where}: beam_size={p.beam_size!r} must be an int '
                       '>= 1.')
    if p.length_alpha < 0:
      raise ValueError(f'{where}: length_alpha={p.length_alpha} must be >= '
                       '0.')
    if not p.decode_cache and (p.beam_size != 1 or p.length_alpha):
      raise ValueError(
          f'{where}: decode_cache=False decodes greedily; set beam_size=1 '
          'and length_alpha=0, or decode_cache=True.')
    emb_init = base_layer.WeightInit.Gaussian(p.model_dim**-0.5)
    names = ['emb'] if p.shared_embedding else ['src_emb', 'tgt_emb']
    sizes = [p.src_vocab_size, p.tgt_vocab_size]
    for name, size in zip(names, sizes):
      self.CreateChild(name, layers.EmbeddingLayer.Params().Set(
          vocab_size=size, embedding_dim=p.model_dim, scale_sqrt_depth=True,
          params_init=emb_init))
    self.CreateChild('pos_emb', attention.PositionalEmbeddingLayer.Params()
                     .Set(embedding_dim=p.model_dim))
    for side in ('src', 'tgt'):
      self.CreateChild(f'{side}_dropout', dropout.DropoutLayer.Params().Set(
          keep_prob=1.0 - p.input_dropout_prob))
    self.CreateChild('stack', p.stack)
    self._tokenizer: Optional[Any] = None  # for decoding, on first use

  # ---- pieces ---------------------------------------------------------------

  def _Table(self, side: str) -> str:
    return 'emb' if self.params.shared_embedding else f'{side}_emb'

  def _Device(self, index: int) -> Optional[str]:
    if isinstance(self.stack, gpipe.PipeliningLayer):
      return self.stack.devices[index]
    return None

  def _Embed(self, theta: NestedMap, side: str, ids: tf.Tensor,
             example_keys: Optional[tf.Tensor]) -> tf.Tensor:
    """ids [b, t] -> embeddings + positions, dropped out: [b, t, d]."""
    name = self._Table(side)
    x = self.children[name].EmbLookup(theta[name], ids)
    x += self.pos_emb.FProp(theta.pos_emb, seq_length=tf.shape(ids)[1])[None]
    drop = f'{side}_dropout'
    return self.children[drop].FProp(theta[drop], x, example_keys)

  def _Logits(self, theta: NestedMap, vec: tf.Tensor) -> tf.Tensor:
    name = self._Table('tgt')
    with tf.device(self._Device(-1)):
      return self.children[name].Logits(theta[name], vec)

  def _SourceState(self, theta: NestedMap, src: NestedMap,
                   example_keys: Optional[tf.Tensor]) -> NestedMap:
    with tf.device(self._Device(0)):
      state = NestedMap(
          vec=self._Embed(theta, 'src', src.ids, example_keys),
          paddings=src.paddings)
    if example_keys is not None:
      state.example_keys = example_keys
    return state

  def _AddTarget(self, theta: NestedMap, state: NestedMap, ids: tf.Tensor,
                 paddings: tf.Tensor) -> NestedMap:
    state = NestedMap(state)
    with tf.device(self._Device(0)):
      state.tgt_vec = self._Embed(theta, 'tgt', ids,
                                  state.get('example_keys'))
    state.tgt_paddings = paddings
    return state

  # ---- BaseTask -------------------------------------------------------------

  def _StackInputs(self, theta: NestedMap, input_batch: NestedMap
                   ) -> NestedMap:
    """The stack's input state: both sides embedded, on its first device."""
    keys = input_batch.get('example_keys')
    tgt = input_batch.tgt
    state = self._SourceState(theta, input_batch.src, keys)
    return self._AddTarget(theta, state, tgt.ids, tgt.paddings)

  def ComputePredictions(self, theta: NestedMap,
                         input_batch: NestedMap) -> NestedMap:
    """NestedMap(logits [b, t, V]) for the target positions."""
    out = self.stack.FProp(theta.stack, self._StackInputs(theta, input_batch))
    return NestedMap(logits=self._Logits(theta, out.vec))

  def OnePassTraining(self, theta: NestedMap, input_batch: NestedMap
                      ) -> Optional[base_model.OnePass]:
    """A pipelined stack trains in one pass; the head is the tied softmax
    and ComputeLoss, reading only the softmax's table."""
    if not isinstance(self.stack, gpipe.PipeliningLayer):
      return None
    table = self._Table('tgt')

    def Head(head_theta: NestedMap, out: NestedMap, batch: NestedMap
             ) -> base_model.Metrics:
      predictions = NestedMap(logits=self._Logits(head_theta, out.vec))
      return self.ComputeLoss(head_theta, predictions, batch)[0]

    tgt = input_batch.tgt
    paddings = tf.cast(tgt.paddings, tf.float32)
    return base_model.OnePass(
        network=self.stack, theta=theta.stack,
        inputs=self._StackInputs(theta, input_batch), head=Head,
        head_theta=NestedMap({table: theta[table]}),
        head_batch=NestedMap(tgt=NestedMap(labels=tgt.labels,
                                           paddings=tgt.paddings)),
        loss_weight=tf.reduce_sum(1.0 - paddings))

  def ComputeLoss(self, theta: NestedMap, predictions: NestedMap,
                  input_batch: NestedMap
                  ) -> Tuple[base_model.Metrics, NestedMap]:
    """loss (smoothed xent per token), log_pplx, token_accuracy.

    Each metric is (mean over non-padded target tokens, their number).
    per_example: NestedMap(xent [b] summed over tokens, without label
    smoothing; num_tokens [b]).
    """
    del theta  # The loss has no variables.
    tgt = input_batch.tgt
    logits = predictions.logits
    with tf.device(self._Device(-1)):
      xent = layers.SoftmaxCrossEntropy(
          logits, class_ids=tgt.labels,
          label_smoothing=self.params.label_smoothing,
          paddings=tgt.paddings)
      weight = xent.per_example_weight                      # [b, t]
      num_tokens = xent.total_weight
      nll = -tf.gather(xent.log_probs, tgt.labels, batch_dims=2)
      correct = tf.cast(
          tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32),
                   tgt.labels), weight.dtype)
      log_pplx = tf.math.divide_no_nan(tf.reduce_sum(nll * weight),
                                       num_tokens)
      accuracy = tf.math.divide_no_nan(tf.reduce_sum(correct * weight),
                                       num_tokens)
    metrics = {'loss': (xent.avg_loss, num_tokens),
               'log_pplx': (log_pplx, num_tokens),
               'token_accuracy': (accuracy, num_tokens)}
    per_example = NestedMap(xent=tf.reduce_sum(nll * weight, axis=1),
                            num_tokens=tf.reduce_sum(weight, axis=1))
    return metrics, per_example

  def Decode(self, theta: NestedMap, input_batch: NestedMap) -> NestedMap:
    """Beam search (p.beam_size, p.length_alpha); static output shapes.

    Returns:
      NestedMap(hyp_ids int32 [b, T], hyp_lengths int32 [b], scores [b]
      (log-probability over the length penalty, float32), src_ids [b, s]
      and, if the batch has a target, ref_ids [b, t] (tgt.labels)); T is
      p.max_decode_length or the target length t.
    """
    p = self.params
    src = input_batch.src
    max_length = self._DecodeLength(input_batch)
    batch_size = src.ids.shape[0]
    if batch_size is None:
      raise ValueError(
          f"TransformerMT '{self.path}': Decode needs a static batch size; "
          'use drop_remainder batches (MTInput does).')
    encoder_steps, decoder_steps = transformer.SplitAtSwitch(
        transformer.StackSteps(self.stack, theta.stack))
    encoded = transformer.RunSteps(
        encoder_steps, self._SourceState(theta, src,
                                         input_batch.get('example_keys')))
    if p.decode_cache:
      hyps = self._BeamSearch(theta, encoded, decoder_steps, batch_size,
                              max_length)
    else:
      no_paddings = tf.zeros([batch_size, max_length], src.paddings.dtype)

      def LogitsFn(prefix_ids: tf.Tensor) -> tf.Tensor:
        state = self._AddTarget(theta, encoded, prefix_ids, no_paddings)
        out = transformer.RunSteps(decoder_steps, state)
        return self._Logits(theta, out.vec)

      hyps = decoder.GreedyDecodeUncached(LogitsFn, batch_size, max_length)
    out = NestedMap(hyp_ids=hyps.ids, hyp_lengths=hyps.lengths,
                    scores=hyps.scores, src_ids=src.ids)
    if 'tgt' in input_batch:
      out.ref_ids = input_batch.tgt.labels
    for key in ('pair', 'index'):  # index: bucketed inputs (MTInput)
      if key in input_batch:
        out[key] = input_batch[key]
    return out

  def _BeamSearch(self, theta: NestedMap, encoded: NestedMap,
                  decoder_steps: List[transformer.Step], batch_size: int,
                  max_length: int) -> NestedMap:
    """beam_search.BeamSearch over the decoder layers' ExtendStep."""
    p = self.params
    k = p.beam_size
    switch_device, switch, switch_theta = decoder_steps[0]
    with tf.device(switch_device):
      memory = NestedMap(
          encoder_vec=tf.repeat(switch.EncoderOutput(switch_theta, encoded),
                                k, axis=0),
          encoder_paddings=tf.repeat(encoded.paddings, k, axis=0))
    # Per decoder layer: its self-attention keys and values (the beams'
    # cache, reordered with them) and its cross-attention ones (the same
    # for every beam of a sentence: captured, never reordered).
    caches, crosses = [], []
    for device, layer, layer_theta in decoder_steps[1:]:
      cache = NestedMap(self_kv=NestedMap(), cross_kv=NestedMap())
      if hasattr(layer, 'ExtendStep'):
        with tf.device(device):
          cache = layer.InitDecodeCache(layer_theta, memory.encoder_vec,
                                        max_length)
      caches.append(cache.self_kv)
      crosses.append(cache.cross_kv)

    def Step(ids: tf.Tensor, t: tf.Tensor,
             caches: List[NestedMap]) -> Tuple[tf.Tensor, List[NestedMap]]:
      with tf.device(self._Device(0)):
        name = self._Table('tgt')
        vec = self.children[name].EmbLookup(theta[name], ids[:, tf.newaxis])
        vec += self.pos_emb.FProp(theta.pos_emb,
                                  positions=tf.fill([ids.shape[0], 1], t))
      state = NestedMap(memory, vec=vec,
                        paddings=tf.zeros([ids.shape[0], 1], vec.dtype))
      new_caches = []
      for (device, layer, layer_theta), self_kv, cross_kv in zip(
          decoder_steps[1:], caches, crosses):
        with tf.device(device):
          if hasattr(layer, 'ExtendStep'):
            state, cache = layer.ExtendStep(
                layer_theta, state,
                NestedMap(self_kv=self_kv, cross_kv=cross_kv), t)
            self_kv = cache.self_kv
          else:
            state = layer.FProp(layer_theta, state)
        new_caches.append(self_kv)
      logits = self._Logits(theta, state.vec)[:, 0]
      return tf.nn.log_softmax(tf.cast(logits, tf.float32)), new_caches

    return beam_search.BeamSearch(Step, caches, batch_size, k, max_length,
                                  p.length_alpha)

  def _DecodeLength(self, input_batch: NestedMap) -> int:
    if self.params.max_decode_length is not None:
      return self.params.max_decode_length
    if 'tgt' not in input_batch or input_batch.tgt.ids.shape[1] is None:
      raise ValueError(
          f"TransformerMT '{self.path}': set p.max_decode_length; the batch "
          'has no target of static length to take it from.')
    return int(input_batch.tgt.ids.shape[1])

  def _Detokenizer(self) -> Callable[[np.ndarray], List[str]]:
    """ids [n, T] -> n texts: the vocabulary's, or the ids as words."""
    if self._tokenizer is None and self.params.vocab_file:
      self._tokenizer = vocabulary.Load(self.params.vocab_file)
    tok = self._tokenizer
    if tok is None:
      return lambda rows: [' '.join(map(str, decoder.TrimIds(r)))
                           for r in rows]
    return lambda rows: [t.decode('utf-8') for t in tok.Decode(
        np.asarray(rows)).numpy().tolist()]

  def CreateDecoderMetrics(self) -> Dict[str, Any]:
    """bleu (sacreBLEU, 0-100), exact_match (fraction), bleu_<pair>."""
    metrics = {'bleu': bleu.SacreBleuMetric(),
               'exact_match': base_model.AverageMetric()}
    for name in self.params.pair_names:
      metrics[f'bleu_{name}'] = bleu.SacreBleuMetric()
    return metrics

  def PostProcessDecodeOut(self, decode_out: Dict[str, Any],
                           metrics: Dict[str, Any]) -> None:
    """Adds each decoded sentence (up to </s>) against its reference."""
    detok = self._Detokenizer()
    hyps = detok(decode_out['hyp_ids'])
    refs = detok(decode_out['ref_ids'])
    srcs = detok(decode_out['src_ids'])
    names = self.params.pair_names
    pairs = decode_out.get('pair')
    if names and pairs is None:
      raise ValueError(
          f"TransformerMT '{self.path}': pair_names is set but the batches "
          'have no `pair`; read them with MultilingualMTInput.')
    index = decode_out.get('index')
    for i, (hyp, ref, src, hyp_row, ref_row) in enumerate(zip(
        hyps, refs, srcs, decode_out['hyp_ids'], decode_out['ref_ids'])):
      if index is not None and index[i] < 0:
        continue  # a row filling a bucket's last batch
      metrics['bleu'].Add(hyp, ref, src,
                          order=None if index is None else int(index[i]))
      if names:
        metrics[f'bleu_{names[int(pairs[i])]}'].Add(hyp, ref, src)
      metrics['exact_match'].Update(
          float(decoder.TrimIds(hyp_row) == decoder.TrimIds(ref_row)))

  def DecodeFinalize(self, metrics: Dict[str, Any],
                     path_prefix: str) -> Optional[str]:
    """Writes <prefix>.src.txt, .hyp.txt, .ref.txt; returns the BLEU line."""
    metric = metrics['bleu']
    tf.io.gfile.makedirs(os.path.dirname(path_prefix))
    for suffix, lines in zip(('src', 'hyp', 'ref'), metric.Texts()):
      with tf.io.gfile.GFile(f'{path_prefix}.{suffix}.txt', 'w') as f:
        f.write(''.join(line + '\n' for line in lines))
    on = 'text' if self.params.vocab_file else 'id strings (no vocab_file)'
    lines = [f'sacreBLEU {metric.value:.2f} on {metric.total_weight} '
             f'sentences ({on}), signature {metric.signature}; '
             f'hypotheses in {path_prefix}.hyp.txt']
    for name in self.params.pair_names:
      pair = metrics[f'bleu_{name}']
      lines.append(f'  {name}: sacreBLEU {pair.value:.2f} on '
                   f'{pair.total_weight} sentences')
    return '\n'.join(lines)
