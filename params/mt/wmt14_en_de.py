"""Transformer-Big on WMT'14 English-German, pipelined with GPipe.

  python -m lingvo_pipe.trainer --model=mt.wmt14_en_de.TransformerBigGPipe \\
      --logdir=/tmp/wmt14 --data_dir=DIR

The data is the TFDS catalog dataset 'wmt14_translate/de-en' (features 'de'
and 'en'), translated English -> German. This machine cannot download it:
on a machine with internet access run `tfds build wmt14_translate/de-en
--data_dir=DIR`, copy DIR here and pass --data_dir=DIR. The vocabulary is
MTInput's word vocabulary of the 32000 most frequent words of both sides
(built from the train split on first use and cached under DIR).
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
  4000 warm-up steps, label smoothing 0.1; 128 sentence pairs of up to 64
  tokens per step.
  """

  DATASET = 'wmt14_translate/de-en'
  SOURCE_KEY = 'en'
  TARGET_KEY = 'de'
  VOCAB_SIZE = 32000
  MAX_LENGTH = 64
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
