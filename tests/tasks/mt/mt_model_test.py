"""Tests of TransformerMT: pipelined = unpipelined, loss, causality, decode.

Exactness checks run eagerly in float64: tracing is what costs time here.
decoder_test.py trains a tiny model and checks what it decodes.
"""

import os
import re

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import sacrebleu
import tensorflow as tf

from lingvo_pipe.core import devices

devices.SplitCpu(4)

from lingvo_pipe.core import dropout  # noqa: E402
from lingvo_pipe.core.nested_map import NestedMap  # noqa: E402
from lingvo_pipe.tasks.mt import model  # noqa: E402
from lingvo_pipe.tasks.mt import tokenizer  # noqa: E402
from lingvo_pipe.tasks.mt import transformer  # noqa: E402

_B, _S, _T, _D, _V = 4, 6, 5, 8, 12
_TOL = dict(atol=1e-10, rtol=1e-10)
_EOS, _SOS = tokenizer.EOS_ID, tokenizer.SOS_ID


def _Layers(dropout_prob=0.1, num_layers=2, dim=_D):
  return transformer.TransformerLayers(
      num_layers, num_layers, dim, 2 * dim, 2, dropout_prob=dropout_prob,
      atten_dropout_prob=dropout_prob, relu_dropout_prob=dropout_prob)


def _TaskParams(stack, dtype=tf.float64, dim=_D, vocab=_V, **kwargs):
  p = model.TransformerMT.Params().Set(
      name='mt', src_vocab_size=vocab, tgt_vocab_size=vocab, model_dim=dim,
      stack=stack, input_dropout_prob=0.1, label_smoothing=0.1, dtype=dtype,
      random_seed=3)
  return p.Set(**kwargs)


def _Task(stack, **kwargs):
  return _TaskParams(stack, **kwargs).Instantiate()


def _Pipelined(num_partitions=2, num_micro_batches=2, **kwargs):
  return transformer.PipelinedStack(_Layers(**kwargs), num_partitions,
                                    num_micro_batches)


def _Batch(seed=0, src_len=(6, 4, 5, 3), tgt_len=(5, 2, 4, 3)):
  """Random sentences of the given lengths (</s> included), padded."""
  rng = np.random.default_rng(seed)
  src = np.zeros([_B, _S], np.int32)
  ids = np.zeros([_B, _T], np.int32)
  labels = np.zeros([_B, _T], np.int32)
  for b in range(_B):
    src[b, :src_len[b]] = list(rng.integers(4, _V, src_len[b] - 1)) + [_EOS]
    words = list(rng.integers(4, _V, tgt_len[b] - 1))
    ids[b, :tgt_len[b]] = [_SOS] + words
    labels[b, :tgt_len[b]] = words + [_EOS]
  pad = lambda ids: (ids == 0).astype(np.float32)  # noqa: E731
  return NestedMap(
      src=NestedMap(ids=tf.constant(src), paddings=tf.constant(pad(src))),
      tgt=NestedMap(ids=tf.constant(ids), labels=tf.constant(labels),
                    paddings=tf.constant(pad(labels))))


def _WithKeys(batch, step=7):
  batch = NestedMap(batch)
  batch.example_keys = dropout.ExampleKeys(step, _B)
  return batch


def _LossAndGrads(task, batch):
  variables = dict(task.VariablesByPath())
  names = sorted(variables)
  with tf.GradientTape() as tape:
    metrics, _ = task.FProp(task.theta, batch)
  grads = tape.gradient(metrics['loss'][0], [variables[n] for n in names])
  # 'mt/stack/cell_1/decoder_0/...' -> 'mt/stack/decoder_0/...'
  plain = [re.sub(r'/cell_\d+/', '/', n) for n in names]
  return metrics, dict(zip(plain, grads))


class PipelinedEqualsSequentialTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(('k2_m2', 2, 2), ('k3_m4', 3, 4))
  def testLossAndEveryGradient(self, k, m):
    piped = _Task(_Pipelined(k, m))
    plain = _Task(transformer.SequentialStack(_Layers()))
    self.assertLen(piped.stack.cells, k)
    # The same initial weights, whatever the split (seed paths skip cells).
    want_vars = {n: v.numpy() for n, v in plain.VariablesByPath().items()}
    got_vars = {re.sub(r'/cell_\d+/', '/', n): v.numpy()
                for n, v in piped.VariablesByPath().items()}
    self.assertEqual(sorted(want_vars), sorted(got_vars))
    for name, value in want_vars.items():
      self.assertAllEqual(value, got_vars[name], msg=name)

    batch = _WithKeys(_Batch())
    want_metrics, want_grads = _LossAndGrads(plain, batch)
    got_metrics, got_grads = _LossAndGrads(piped, batch)
    self.assertEqual(sorted(want_metrics), ['log_pplx', 'loss',
                                            'token_accuracy'])
    for name, (value, weight) in want_metrics.items():
      self.assertAllClose(value, got_metrics[name][0], **_TOL, msg=name)
      self.assertAllClose(weight, got_metrics[name][1], **_TOL, msg=name)
    self.assertEqual(sorted(want_grads), sorted(got_grads))
    for name, want in want_grads.items():
      self.assertIsNotNone(want, name)
      self.assertGreater(np.abs(want.numpy()).max(), 0.0, name)
      self.assertAllClose(want, got_grads[name], **_TOL, msg=name)

  @parameterized.named_parameters(('gpipe', 'gpipe', 1), ('1f1b', '1f1b', 1),
                                  ('interleaved', 'interleaved_1f1b', 2))
  def testOnePassTrainingGradients(self, schedule, v):
    """The training step's one pass (embeddings before the pipeline, the
    tied softmax after it) against the sequential stack's FProp."""
    stack = transformer.PipelinedStack(_Layers(), 2 * v, 2)
    stack.Set(schedule=schedule, num_virtual_stages=v)
    piped = _Task(stack)
    plain = _Task(transformer.SequentialStack(_Layers()))
    batch = _WithKeys(_Batch())
    want_metrics, want_grads = _LossAndGrads(plain, batch)
    metrics, grads = tf.function(piped.Gradients, autograph=False)(batch)
    for name, (value, weight) in want_metrics.items():
      self.assertAllClose(value, metrics[name][0], **_TOL, msg=name)
      self.assertAllClose(weight, metrics[name][1], **_TOL, msg=name)
    grads = {re.sub(r'/cell_\d+/', '/', n): g for n, g in grads.items()}
    self.assertEqual(sorted(want_grads), sorted(grads))
    for name, want in want_grads.items():
      self.assertAllClose(want, grads[name], **_TOL, msg=name)

  def testDropoutIsOnInTrainingAndOffInEval(self):
    task = _Task(_Pipelined())
    batch = _WithKeys(_Batch())
    train = task.ComputePredictions(task.theta, batch).logits
    with task._Mode(training=False):  # pylint: disable=protected-access
      eval1 = task.ComputePredictions(task.theta, batch).logits
      eval2 = task.ComputePredictions(task.theta, _WithKeys(_Batch(), 9))
    self.assertAllEqual(eval1, eval2.logits)
    self.assertGreater(np.abs((train - eval1).numpy()).max(), 1e-6)


class LossTest(tf.test.TestCase):

  def testMetricsMatchNumpy(self):
    task = _Task(transformer.SequentialStack(_Layers(0.0)),
                 input_dropout_prob=0.0)
    batch = _WithKeys(_Batch())
    logits = task.ComputePredictions(task.theta, batch).logits.numpy()
    metrics, per_example = task.FProp(task.theta, batch)
    labels = batch.tgt.labels.numpy()
    weight = 1.0 - batch.tgt.paddings.numpy()
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
    smooth = 0.9 * nll - 0.1 * log_probs.mean(-1)
    n = weight.sum()
    self.assertEqual(n, 14)
    self.assertAllClose((smooth * weight).sum() / n, metrics['loss'][0])
    self.assertAllClose(n, metrics['loss'][1])
    self.assertAllClose((nll * weight).sum() / n, metrics['log_pplx'][0])
    correct = (logits.argmax(-1) == labels) * weight
    self.assertAllClose(correct.sum() / n, metrics['token_accuracy'][0])
    self.assertAllClose((nll * weight).sum(1), per_example.xent)
    self.assertAllClose(weight.sum(1), per_example.num_tokens)


class CausalityTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(0, 2, 3)
  def testPositionTIgnoresLaterTargetTokens(self, t):
    task = _Task(_Pipelined())
    task.SetTraining(False)
    batch = _Batch()
    changed = _Batch()
    ids = batch.tgt.ids.numpy()
    ids[:, t + 1:] = (ids[:, t + 1:] + 3) % _V
    changed.tgt.ids = tf.constant(ids)
    want = task.ComputePredictions(task.theta, batch).logits
    got = task.ComputePredictions(task.theta, changed).logits
    self.assertAllEqual(want[:, :t + 1], got[:, :t + 1])
    # The test can fail: what comes later does see the change.
    self.assertGreater(np.abs((want[:, t + 1:] - got[:, t + 1:]).numpy())
                       .max(), 1e-6)

  def testPaddedSourceTokensAreIgnored(self):
    task = _Task(_Pipelined())
    task.SetTraining(False)
    batch = _Batch()
    src = batch.src.ids.numpy()
    src[batch.src.paddings.numpy() > 0] = 7
    changed = _Batch()
    changed.src.ids = tf.constant(src)
    self.assertAllEqual(task.ComputePredictions(task.theta, batch).logits,
                        task.ComputePredictions(task.theta, changed).logits)


class DecodeTest(tf.test.TestCase, parameterized.TestCase):

  def testStaticShapesInAGraph(self):
    task = _Task(_Pipelined(), dtype=tf.float32, max_decode_length=7)
    batch = _Batch()
    spec = tf.nest.map_structure(tf.TensorSpec.from_tensor, batch)
    fn = tf.function(task.DecodeStep, autograph=False)
    out = fn.get_concrete_function(spec).structured_outputs
    self.assertEqual(out.hyp_ids.shape, [_B, 7])
    self.assertEqual(out.hyp_lengths.shape, [_B])
    self.assertEqual(out.scores.shape, [_B])
    self.assertEqual(out.ref_ids.shape, [_B, _T])
    for name, leaf in out.FlattenItems():
      self.assertTrue(leaf.shape.is_fully_defined(), name)
    self.assertEqual(fn(batch).hyp_ids.shape, [_B, 7])

  def testDecodeRunsTheSameLayersAsTraining(self):
    # Teacher forcing with the greedily decoded prefix gives its tokens.
    task = _Task(_Pipelined(), max_decode_length=_T, beam_size=1,
                 length_alpha=0.0)
    task.SetTraining(False)
    batch = _Batch()
    hyp = task.Decode(task.theta, batch).hyp_ids.numpy()
    forced = _Batch()
    forced.tgt.ids = tf.constant(
        np.concatenate([np.full([_B, 1], _SOS), hyp[:, :-1]], 1)
        .astype(np.int32))
    forced.tgt.paddings = tf.zeros([_B, _T])
    logits = task.ComputePredictions(task.theta, forced).logits.numpy()
    done = np.cumsum(hyp == _EOS, 1) - (hyp == _EOS) > 0
    self.assertAllEqual(np.where(done, 0, logits.argmax(-1)), hyp)

  @parameterized.parameters(1, 2)
  def testCachedGreedyEqualsUncached(self, k):
    # Same weights (same seeds and names); K=1 is a plain SequentialLayer.
    stack = (_Pipelined() if k == 2 else
             transformer.SequentialStack(_Layers()))
    greedy = dict(max_decode_length=7, beam_size=1, length_alpha=0.0)
    cached = _Task(stack, **greedy)
    uncached = _Task(stack, decode_cache=False, **greedy)
    batch = _Batch()
    a = cached.DecodeStep(batch)
    b = uncached.DecodeStep(batch)
    self.assertAllEqual(b.hyp_ids, a.hyp_ids)
    self.assertAllEqual(b.hyp_lengths, a.hyp_lengths)
    self.assertAllClose(b.scores, a.scores, atol=1e-5, rtol=0)

  def testBeamIsAtLeastAsProbableAsGreedy(self):
    # Scores with alpha 0 are log-probabilities: check them by teacher
    # forcing, and that the beam's are at least greedy's.
    batch = _Batch(seed=2)
    outs = {}
    for k in (1, 4):
      task = _Task(_Pipelined(), max_decode_length=_T, beam_size=k,
                   length_alpha=0.0)
      out = task.DecodeStep(batch)
      forced = _Batch(seed=2)
      hyp = out.hyp_ids.numpy()
      forced.tgt.ids = tf.constant(np.concatenate(
          [np.full([_B, 1], _SOS), hyp[:, :-1]], 1).astype(np.int32))
      forced.tgt.paddings = tf.zeros([_B, _T])
      with task._Mode(training=False):  # pylint: disable=protected-access
        logits = task.ComputePredictions(task.theta, forced).logits
      logp = tf.gather(tf.nn.log_softmax(logits), hyp, batch_dims=2)
      mask = np.arange(_T)[None] < out.hyp_lengths.numpy()[:, None]
      # Scores are summed in float32.
      self.assertAllClose(np.sum(logp.numpy() * mask, 1), out.scores,
                          atol=1e-5, rtol=0)
      outs[k] = out.scores.numpy()
    self.assertTrue(np.all(outs[4] >= outs[1] - 1e-5), outs)

  def testDecoderWritesTextsAndScoresThemWithSacreBleu(self):
    tmp = self.create_tempdir().full_path
    vocab = tokenizer.Tokenizer(list(tokenizer.SPECIAL_TOKENS) +
                                [f'w{i}.' for i in range(_V - 4)])
    vocab.Save(os.path.join(tmp, 'vocab.txt'))
    task = _Task(_Pipelined(), max_decode_length=_T,
                 vocab_file=os.path.join(tmp, 'vocab.txt'))
    batch = _Batch()
    out = tf.nest.map_structure(lambda t: t.numpy(), task.DecodeStep(batch))
    metrics = task.CreateDecoderMetrics()
    task.PostProcessDecodeOut(out, metrics)
    prefix = os.path.join(tmp, 'decoder_test', 'step_7')
    line = task.DecodeFinalize(metrics, prefix)
    texts = {}
    for suffix in ('src', 'hyp', 'ref'):
      with open(f'{prefix}.{suffix}.txt', encoding='utf-8') as f:
        texts[suffix] = f.read().splitlines()
    decode = lambda ids: [t.decode() for t in vocab.Decode(ids).numpy()]  # noqa: E731
    self.assertEqual(decode(batch.tgt.labels), texts['ref'])
    self.assertEqual(decode(batch.src.ids), texts['src'])
    self.assertEqual(decode(out.hyp_ids), texts['hyp'])
    want = sacrebleu.corpus_bleu(texts['hyp'], [texts['ref']]).score
    self.assertEqual(want, metrics['bleu'].value)
    self.assertIn(f'sacreBLEU {want:.2f} on {_B} sentences (text)', line)
    self.assertIn('signature nrefs:1|case:mixed|eff:no|tok:13a', line)
    self.assertIn(f'{prefix}.hyp.txt', line)

  def testBleuPerLanguagePair(self):
    task = _Task(_Pipelined(), max_decode_length=_T,
                 pair_names=['en-xx', 'xx-en'])
    batch = _Batch()
    batch.pair = tf.constant([0, 1, 1, 0], tf.int32)
    out = tf.nest.map_structure(lambda t: t.numpy(), task.DecodeStep(batch))
    self.assertAllEqual([0, 1, 1, 0], out.pair)
    metrics = task.CreateDecoderMetrics()
    task.PostProcessDecodeOut(out, metrics)
    self.assertEqual(2, metrics['bleu_en-xx'].total_weight)
    self.assertEqual(2, metrics['bleu_xx-en'].total_weight)
    _, hyps, refs = metrics['bleu'].Texts()
    self.assertEqual(([hyps[0], hyps[3]], [refs[0], refs[3]]),
                     metrics['bleu_en-xx'].Texts()[1:])
    line = task.DecodeFinalize(metrics, self.create_tempdir().full_path +
                               '/step_1')
    self.assertIn('\n  xx-en: sacreBLEU', line)
    del out.pair
    with self.assertRaisesRegex(ValueError, 'have no `pair`'):
      task.PostProcessDecodeOut(out, task.CreateDecoderMetrics())

  def testParamErrors(self):
    with self.assertRaisesRegex(ValueError, 'decode_cache=False decodes'):
      _Task(_Pipelined(), decode_cache=False)
    with self.assertRaisesRegex(ValueError, 'beam_size=0'):
      _Task(_Pipelined(), beam_size=0)
    with self.assertRaisesRegex(ValueError, 'shared_embedding'):
      _Task(_Pipelined(), tgt_vocab_size=_V + 1)
    with self.assertRaisesRegex(ValueError, 'set p.stack'):
      _Task(None)


if __name__ == '__main__':
  absltest.main()
