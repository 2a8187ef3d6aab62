"""Every registered MT model builds, and trains one step at a tiny size.

The registered params are built as they are (params only: no variables).
The training step uses the same recipe with tiny sizes (a subclass that
changes the knobs of params/mt/base.py, keeping the pipeline's K up to
the 4 devices this test has; M=1 halves the ops to trace, and
mt_model_test.py covers M > 1): on
'lingvo_pipe_synthetic_translation/tiny' for local builders and on
tfds.testing.mock_data for catalog datasets (nothing is downloaded); the
folder models read a folder of 16 sentence pairs the test writes.
"""

import importlib
import inspect
import os
import pkgutil
import shutil
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import sacrebleu
import tensorflow as tf
import tensorflow_datasets as tfds

from lingvo_pipe.core import devices

devices.SplitCpu(4)

from lingvo_pipe.core import base_input_generator  # noqa: E402
from lingvo_pipe.core import base_layer  # noqa: E402
from lingvo_pipe.core import base_model  # noqa: E402
from lingvo_pipe.core import model_registry  # noqa: E402
from lingvo_pipe.tasks.mt import folder_input  # noqa: E402
from lingvo_pipe.tasks.mt import model  # noqa: E402
from lingvo_pipe.tasks.mt import transformer  # noqa: E402
import params.mt  # noqa: E402
from tests import folder_testlib  # noqa: E402

_TEST_DEVICES = 4
# Batches of 4 pairs of 8 tokens, not in length buckets (those are
# mt_buckets_test's and trainer_buckets_test's).
_TINY = dict(MODEL_DIM=8, HIDDEN_DIM=16, NUM_HEADS=2, NUM_ENCODER_LAYERS=1,
             NUM_DECODER_LAYERS=1, BATCH_SIZE=4, EVAL_BATCH_SIZE=4,
             MAX_LENGTH=8, NUM_MICRO_BATCHES=1, SHUFFLE_BUFFER_SIZE=8,
             BUCKET_UPPER_BOUND=(), EVAL_BUCKET_UPPER_BOUND=())


def _MtModelKeys():
  """Keys of the registered classes of every module under params/mt."""
  keys = []
  for info in pkgutil.iter_modules(params.mt.__path__):
    module = importlib.import_module(f'params.mt.{info.name}')
    for name, cls in inspect.getmembers(module, inspect.isclass):
      key = f'mt.{info.name}.{name}'
      if cls.__module__ != module.__name__:
        continue
      try:
        if model_registry.GetClass(key) is cls:
          keys.append(key)
      except LookupError:
        pass  # A base class, not registered.
  return sorted(keys)


_KEYS = _MtModelKeys()
_NAMED_KEYS = [(key.replace('.', '_'), key) for key in _KEYS]


def _TinyParams(key, data_dir):
  cls = model_registry.GetClass(key)
  attrs = dict(_TINY, DATA_DIR=data_dir,
               NUM_PARTITIONS=min(cls.NUM_PARTITIONS, _TEST_DEVICES))
  if base_input_generator.IsLocalBuilder(cls.DATASET):
    attrs['DATASET'] = cls.DATASET.split('/')[0] + '/tiny'
  tiny = type(f'{cls.__name__}Tiny', (cls,), attrs)()
  return tiny.Task().Set(name='task'), tiny.Train(), tiny.Dev()


def _DistinctTinyKeys():
  """One key per distinct tiny version, named as _NAMED_KEYS.

  Classes that differ only in what _TINY replaces (Transformer24x24GPipe
  and TransformerBigGPipe: sizes) build the same tiny params, so the same
  training step; it is traced once (10 s each).
  """
  first = {}
  for name, key in _NAMED_KEYS:
    text = '\n'.join(p.ToText() for p in _TinyParams(key, '/data'))
    first.setdefault(text, (name, key))
  return sorted(first.values())


class RegisteredMTModelsTest(tf.test.TestCase, parameterized.TestCase):

  def testTheBuiltInModelsAreRegistered(self):
    self.assertContainsSubset(['mt.synthetic.TransformerTinyGPipe',
                               'mt.wmt14_en_de.TransformerBigGPipe'], _KEYS)

  @parameterized.named_parameters(*_NAMED_KEYS)
  def testRealParamsAreConsistent(self, key):
    p = model_registry.GetParams(key)
    cls = model_registry.GetClass(key)
    task = p.task
    self.assertIs(model.TransformerMT, task.cls)
    self.assertEqual(cls.NUM_PARTITIONS, base_model.NumDevicesNeeded(task))
    want = [lp.name for lp in transformer.TransformerLayers(
        cls.NUM_ENCODER_LAYERS, cls.NUM_DECODER_LAYERS, 8, 8, 1)]
    self.assertEqual(want, [s.name for c in task.stack.cell_tpl
                            for s in c.sub])
    m = task.stack.num_micro_batches
    for input_p in (p.train_input, p.dev_input, p.test_input):
      self.assertEqual(0, input_p.batch_size % m, input_p.name)
      self.assertEqual(task.src_vocab_size, input_p.max_vocab_size)
      self.assertEqual(task.tgt_vocab_size, input_p.max_vocab_size)
    self.assertTrue(p.train_input.repeat)
    self.assertFalse(p.dev_input.repeat)
    self.assertIn('task.stack.cell_tpl[0]', p.ToText())

  # Vaswani et al. (2017): base 65M, big 213M with a shared 37k vocabulary.
  @parameterized.parameters(('TransformerBaseGPipe', 65e6),
                            ('TransformerBigGPipe', 213e6))
  def testWmtParameterCounts(self, name, paper):
    count, _ = self._Count(f'mt.wmt14_en_de.{name}')
    self.assertLess(abs(count - paper) / paper, 0.03)

  def test24x24OnlyFitsPipelined(self):
    # Weights and Adam's two slots, 12 bytes a parameter: above an 8 GB
    # accelerator whole, well within it per partition.
    count, parts = self._Count('mt.wmt14_en_de.Transformer24x24GPipe')
    self.assertLen(parts, 4)
    self.assertGreater(12 * count, 8e9)
    self.assertLess(12 * max(parts), 8e9 / 3)

  def testDeepestPaperSetting(self):
    # GPipe's T(64, 16384, 32): 64 + 64 layers, ff 16384, 32 heads, d 1024,
    # a 64k vocabulary, 16 partitions ("6B", a round figure: the module
    # docstring). Counted shapes-only, against the architecture's formula.
    key = 'mt.wmt_multilingual.Transformer64x64GPipe'
    cls = model_registry.GetClass(key)
    d, h, v = 1024, 16384, 64000
    self.assertEqual((64, 64, d, h, 32, v, 16),
                     (cls.NUM_ENCODER_LAYERS, cls.NUM_DECODER_LAYERS,
                      cls.MODEL_DIM, cls.HIDDEN_DIM, cls.NUM_HEADS,
                      cls.VOCAB_SIZE, cls.NUM_PARTITIONS))
    count, parts = self._Count(key)
    self.assertEqual(_TransformerCount(64, 64, d, h, v), count)
    self.assertLen(parts, 16)
    self.assertBetween(count, 5.0e9, 6.0e9)
    # Weights and Adam's slots: far above one 16 GB accelerator whole,
    # about a quarter of one per partition (4.0 GB for 8 decoder layers).
    self.assertGreater(12 * count, 3 * 16e9)
    self.assertLess(12 * max(parts), 16e9 / 3)

  def _Count(self, key):
    """(the task's parameters, each partition's), shapes only.

    The task is built with K=1 (a K=16 PipeliningLayer wants 16 devices,
    this test has 4); the partitions are counted from the real cell_tpl.
    """
    cls = model_registry.GetClass(key)
    p = model_registry.GetParams(key)
    one = type(f'{cls.__name__}K1', (cls,), dict(NUM_PARTITIONS=1))()
    with base_layer.VariableShapesOnly():
      task = one.Task().Set(name='task').Instantiate()
      parts = [base_layer.NumParameters(cell.Copy().Set(
          name=f'cell{i}').Instantiate())
               for i, cell in enumerate(p.task.stack.cell_tpl)]
      self.assertEqual(base_layer.NumParameters(task.stack), sum(parts))
      return base_layer.NumParameters(task), parts

  @parameterized.named_parameters(*_DistinctTinyKeys())
  def testTinyVersionTrainsOneStepAndDecodes(self, key):
    data_dir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, data_dir, ignore_errors=True)
    dataset = model_registry.GetClass(key).DATASET
    if dataset == folder_input.NAME:
      folder_testlib.WritePairs(data_dir, {'train': 16, 'test': 16})
    elif not base_input_generator.IsLocalBuilder(dataset):
      self.enter_context(tfds.testing.mock_data(num_examples=16))
    task_p, train_p, dev_p = _TinyParams(key, data_dir)
    if dataset == folder_input.NAME:  # the vocabulary goes outside the folder
      train_p.vocab_file = dev_p.vocab_file = os.path.join(
          self.create_tempdir().full_path, 'vocab.txt')
    task = task_p.Instantiate()
    self.assertEqual(
        min(model_registry.GetClass(key).NUM_PARTITIONS, _TEST_DEVICES),
        task.stack.num_partitions)
    task.CreateTrainState()
    batch = next(iter(train_p.Instantiate().GetDataset()))
    out = tf.function(task.TrainStep, autograph=False)(batch)
    self.assertTrue(np.isfinite(out.loss.numpy()), key)
    self.assertTrue(bool(out.is_finite))
    self.assertEqual(1, int(out.global_step))
    # Evaluation's token accuracy against its definition in numpy (argmax
    # of the logits equal to the label, over real target tokens), on
    # labels half of which are the model's argmax: the logits read the
    # target ids, not the labels, so the accuracy is far from 0 without
    # training, and a wrong count or normaliser shows.
    with task._Mode(training=False):  # pylint: disable=protected-access
      logits = task.ComputePredictions(task.EvalTheta(None),
                                       batch).logits.numpy()
    guess = logits.argmax(-1)
    labels = batch.tgt.labels.numpy().copy()
    half = np.arange(labels.size).reshape(labels.shape) % 2 == 0
    labels[half] = guess[half]
    relabelled = tf.nest.map_structure(lambda t: t, batch)
    relabelled.tgt.labels = tf.constant(labels, batch.tgt.labels.dtype)
    metrics = tf.function(task.EvalStep, autograph=False)(relabelled)
    weight = 1.0 - batch.tgt.paddings.numpy()
    want = ((guess == labels) * weight).sum() / weight.sum()
    self.assertGreater(want, 0.3)
    self.assertAllClose(want, metrics.token_accuracy[0], atol=1e-6, rtol=0)
    # Decoding runs eagerly here (no trace), on a Dev batch.
    dev_batch = next(iter(dev_p.Instantiate().GetDataset()))
    decoded = task.DecodeStep(dev_batch)
    self.assertEqual([4, 8], decoded.hyp_ids.shape)
    # Sentences 0 and 1 get their own hypothesis as reference: those two
    # match exactly and their texts agree, so neither metric can be 0; the
    # score is sacreBLEU's of the texts the metric kept.
    out = tf.nest.map_structure(lambda t: t.numpy(), decoded)
    out.ref_ids = out.ref_ids.copy()
    out.ref_ids[:2] = out.hyp_ids[:2]
    metrics = task.CreateDecoderMetrics()
    task.PostProcessDecodeOut(out, metrics)
    _, hyps, refs = metrics['bleu'].Texts()
    self.assertEqual(hyps[:2], refs[:2])
    self.assertTrue(all(refs[2:]), refs)
    self.assertEqual(sacrebleu.corpus_bleu(hyps, [refs]).score,
                     metrics['bleu'].value)
    self.assertEqual(4, metrics['exact_match'].total_weight)
    self.assertGreaterEqual(metrics['exact_match'].value, 0.5)
    self.assertTrue(all(hyps[:2]), hyps)  # untrained: never </s> first
    self.assertGreater(metrics['bleu'].value, 0.0)


def _TransformerCount(enc, dec, d, h, v):
  """Parameters of our pre-norm Transformer (transformer.py), by formula.

  Attention: Q, K, V, output projections with biases, a layer norm;
  feed-forward: two projections with biases, a layer norm; each stack ends
  in a layer norm; one [v, d] table embeds both sides and is the softmax.
  """
  norm = 2 * d
  attention = 4 * d * d + 4 * d + norm
  feed_forward = 2 * d * h + h + d + norm
  return (enc * (attention + feed_forward) +
          dec * (2 * attention + feed_forward) + 2 * norm + v * d)


if __name__ == '__main__':
  absltest.main()
