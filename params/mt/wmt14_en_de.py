"""Transformers on WMT'14 English-German, pipelined with GPipe.

  python -m lingvo_pipe.trainer --model=mt.wmt14_en_de.TransformerBigGPipe \\
      --logdir=/tmp/wmt14 --data_dir=DIR

Transformer-base and -big are Vaswani et al. (2017)'s (65M and 213M
parameters with their shared 37k vocabulary; ours 63.1M and 214.2M, see
models_test); Transformer24x24GPipe is big's layers 24 + 24 deep (743M
parameters), too big to train on one 8 GB accelerator (weights and Adam's
two slots: 12 bytes a parameter, 8.9 GB), pipelined over 4 (2.2 GB for
the largest partition).

The data is the TFDS catalog dataset 'wmt14_translate/de-en' (features 'de'
and 'en'), translated English -> German. This machine cannot download it:
on a machine with internet access run `tfds build wmt14_translate/de-en
--data_dir=DIR`, copy DIR here and pass --data_dir=DIR. The vocabulary is
a shared sentencepiece vocabulary of at most 37000 subwords over both
sides (built from the train split on first use, in the logdir).
"""

from __future__ import annotations

from lingvo_pipe.core import model_registry
from params.mt import base


@model_registry.RegisterSingleTaskModel
class TransformerBigGPipe(base.TransformerGPipeBase):
  """Transformer-Big (6 + 6 layers, d=1024, ff 4096, 16 heads, dropout 0.3).

  The encoder, switch and decoder are one PipeliningLayer of K=4
  partitions balanced by flops, with M=16 micro-batches (M >= 4K keeps the
  bubble (K-1)/(M+K-1) at 16%). Adam (0.9, 0.98, 1e-9), the Transformer
  learning-rate schedule peaking at 1024^-0.5 * 4000^-0.5 ~ 4.9e-4 after
  4000 warm-up steps, label smoothing 0.1. Training batches come from
  length buckets up to 98 subwords (base.WMT14_BUCKETS), each holding at
  most 128 x 64 tokens (its pairs a multiple of M); evaluation: 128 pairs
  of up to 64 tokens.
  """

  DATASET = 'wmt14_translate/de-en'
  SOURCE_KEY = 'en'
  TARGET_KEY = 'de'
  VOCAB_SIZE = 37000
  MAX_LENGTH = 64
  BUCKET_UPPER_BOUND = base.WMT14_BUCKETS
  BATCH_SIZE = 128
  EVAL_BATCH_SIZE = 128
  SHUFFLE_BUFFER_SIZE = 100000
  DEV_SPLIT = 'validation'
  TEST_SPLIT = 'test'
  MODEL_DIM = 1024
  HIDDEN_DIM = 4096
  NUM_HEADS = 16
  NUM_ENCODER_LAYERS = 6
  NUM_DECODER_LAYERS = 6
  DROPOUT = 0.3
  INPUT_DROPOUT = 0.3
  LABEL_SMOOTHING = 0.1
  NUM_PARTITIONS = 4
  NUM_MICRO_BATCHES = 16
  LEARNING_RATE = 1024**-0.5 * 4000**-0.5
  WARMUP_STEPS = 4000
  MAX_STEPS = 300000
  SAVE_INTERVAL_STEPS = 2000
  EVAL_INTERVAL_STEPS = 2000
  EVAL_STEPS = 24


@model_registry.RegisterSingleTaskModel
class TransformerBaseGPipe(TransformerBigGPipe):
  """Transformer-base (6 + 6 layers, d=512, ff 2048, 8 heads, dropout 0.1).

  K=2 partitions, M=8 micro-batches (bubble 11%); the big model's recipe
  otherwise, the learning rate peaking at 512^-0.5 * 4000^-0.5 ~ 7e-4.
  """

  MODEL_DIM = 512
  HIDDEN_DIM = 2048
  NUM_HEADS = 8
  DROPOUT = 0.1
  INPUT_DROPOUT = 0.1
  NUM_PARTITIONS = 2
  NUM_MICRO_BATCHES = 8
  LEARNING_RATE = 512**-0.5 * 4000**-0.5


@model_registry.RegisterSingleTaskModel
class Transformer24x24GPipe(TransformerBigGPipe):
  """Transformer-big's layers, 24 + 24 deep: 743M parameters, K=4, M=16.

  Only fits pipelined on 8 GB accelerators (module docstring): at most
  185M parameters, 2.2 GB of weights and Adam slots, per partition.
  """

  NUM_ENCODER_LAYERS = 24
  NUM_DECODER_LAYERS = 24
