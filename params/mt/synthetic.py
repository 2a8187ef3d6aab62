"""The built-in MT model: trains offline on the synthetic language pair.

  python -m lingvo_pipe.trainer --model=mt.synthetic.TransformerTinyGPipe \\
      --logdir=/tmp/mt_tiny

lingvo_pipe_synthetic_translation (tasks/mt/synthetic_translation.py) maps
each source word to a target word and swaps adjacent pairs of words; it is
generated locally on first use, no downloads. Its word vocabulary has 4
special ids + 64 source + 64 target words = 132 ids.
"""

from __future__ import annotations

from lingvo_pipe.core import model_registry
from lingvo_pipe.tasks.mt import synthetic_multilingual
from lingvo_pipe.tasks.mt import synthetic_translation
from params.mt import base


@model_registry.RegisterSingleTaskModel
class TransformerTinyGPipe(base.TransformerGPipeBase):
  """A small Transformer, 2 + 2 layers, d=64, over K=2 partitions, M=4.

  One PipeliningLayer holds the encoder, the switch and the decoder
  (transformer.py); it needs 2 devices (the trainer splits the CPU).

  1200 steps of 32 sentence pairs, then the decoder job (README,
  Translation) decodes the whole test split (1000 sentences, beam 4).
  Measured on the idle 2-core machine, both commands: 2 min 0 s in all
  (2026-11-25); dev token accuracy 0.71 / 0.94 / 0.98 / 0.997 at steps
  300 / 600 / 900 / 1200; test sacreBLEU 99.50, exact match 98.3%.
  """

  DATASET = synthetic_translation.NAME
  SOURCE_KEY = synthetic_translation.SOURCE_KEY
  TARGET_KEY = synthetic_translation.TARGET_KEY
  # A closed language of 128 words: a word vocabulary holds it exactly.
  TOKENIZER = 'word'
  VOCAB_SIZE = 4 + 2 * synthetic_translation.NUM_WORDS
  MAX_LENGTH = synthetic_translation.MAX_LENGTH + 2
  BATCH_SIZE = 32
  EVAL_BATCH_SIZE = 40
  SHUFFLE_BUFFER_SIZE = 2000
  MODEL_DIM = 64
  HIDDEN_DIM = 256
  NUM_HEADS = 4
  NUM_ENCODER_LAYERS = 2
  NUM_DECODER_LAYERS = 2
  DROPOUT = 0.0
  INPUT_DROPOUT = 0.0
  LABEL_SMOOTHING = 0.1
  NUM_PARTITIONS = 2
  NUM_MICRO_BATCHES = 4
  LEARNING_RATE = 5e-3
  WARMUP_STEPS = 100
  ADAM_BETA2 = 0.98
  CLIP_GRADIENT_NORM = 1.0
  MAX_STEPS = 1200
  SAVE_INTERVAL_STEPS = 300
  EVAL_INTERVAL_STEPS = 300
  EVAL_STEPS = 25  # the whole validation / test split (1000 sentences)


@model_registry.RegisterSingleTaskModel
class MultilingualTinyGPipe(TransformerTinyGPipe):
  """English to and from three made-up languages, one model, K=2, M=4.

  lingvo_pipe_synthetic_multilingual (synthetic_multilingual.py): six
  directions, each source sentence led by its target language's token
  (Johnson et al. 2017), one word vocabulary of 4 languages x 64 words, 3
  language tokens and 4 special ids. English-to-X pairs are sampled twice
  as often as X-to-English (one target side each, three ways). The
  decoder reports sacreBLEU per pair. Measured on the 2-core machine with
  the README's command: dev token accuracy 0.908 / 0.983 / 0.995 at steps
  1000 / 2000 / 3000; test sacreBLEU 98.26 on 400 sentences (per pair
  96.21 to 100.00, 35 to 100 sentences each); 9 min 13 s for training and
  the decoder job (2026-11-25).
  """

  DATASET = synthetic_multilingual.NAME
  PAIRS = ([(None, 'en', lang, 2.0)
            for lang in synthetic_multilingual.LANGUAGES] +
           [(None, lang, 'en', 1.0)
            for lang in synthetic_multilingual.LANGUAGES])
  VOCAB_SIZE = 4 + 4 * synthetic_translation.NUM_WORDS + 3
  MAX_LENGTH = synthetic_translation.MAX_LENGTH + 3  # + token, </s> or <s>
  MODEL_DIM = 128
  HIDDEN_DIM = 512
  MAX_STEPS = 3000
  SAVE_INTERVAL_STEPS = 1000
  EVAL_INTERVAL_STEPS = 1000
  EVAL_STEPS = 10  # 400 of the 3000 test pairs
