"""The paper's deepest translation model, on WMT'14's five language pairs.

  python -m lingvo_pipe.trainer \\
      --model=mt.wmt_multilingual.Transformer64x64GPipe \\
      --logdir=/tmp/deep --data_dir=DIR --cluster_spec=...  # 16 devices

GPipe's section 5 trains one Transformer between English and 102 other
languages; its deepest setting, T(64, 16384, 32), has 64 encoder and 64
decoder layers (128 in all), feed-forward width 16384, 32 attention heads,
model dimension 1024 and a 64k vocabulary, cut into 16 partitions; the
paper calls it 6B parameters. With exactly those shapes and one embedding
table shared by the source, the target and the softmax, ours has
5,169,483,776 (models_test counts it shapes-only, nothing allocated): the
paper's parameter counts are round figures (its T(6, 8192, 16) "400M" is
343M counted the same way), and its footnote fixes every dimension we use.

The paper's corpus (25 billion internal sentence pairs) is not public; the
data here is the TFDS catalog's WMT'14 pairs cs, de, fr, hi and ru with
English, both directions (many-to-English and English-to-many, one model,
the target language chosen by a leading '<2xx>' token), equal sampling
weights; the paper samples pairs with a temperature over their sizes, a
user with the data sets PAIRS' weights. This machine cannot download the
data: run `tfds build wmt14_translate/<xx>-en --data_dir=DIR` for each
pair elsewhere and pass --data_dir=DIR. Not reproduced: the paper's
deep-model stabilisers (feed-forward initialisation scaled down with depth,
clipped logits).

Memory: 12 bytes a parameter (weights and Adam's two slots) is 62 GB whole;
a partition holds 8 layers, 3.6 GB (encoder) or 4.0 GB (decoder) of it
(models_test).
"""

from __future__ import annotations

from lingvo_pipe.core import model_registry
from params.mt import wmt14_en_de

# The WMT'14 pairs TFDS has, each with English.
LANGUAGES = ('cs', 'de', 'fr', 'hi', 'ru')


@model_registry.RegisterSingleTaskModel
class Transformer64x64GPipe(wmt14_en_de.TransformerBigGPipe):
  """T(64, 16384, 32): 64 + 64 layers, d=1024, ff 16384, 32 heads, K=16.

  M=64 micro-batches of 4 sentence pairs (M = 4K keeps the bubble
  (K-1)/(M+K-1) at 19%); Transformer-big's optimiser and schedule, with
  gradients clipped to norm 1.
  """

  PAIRS = ([(f'wmt14_translate/{lang}-en', lang, 'en', 1.0)
            for lang in LANGUAGES] +
           [(f'wmt14_translate/{lang}-en', 'en', lang, 1.0)
            for lang in LANGUAGES])
  VOCAB_SIZE = 64000
  BATCH_SIZE = 256
  EVAL_BATCH_SIZE = 256
  HIDDEN_DIM = 16384
  NUM_HEADS = 32
  NUM_ENCODER_LAYERS = 64
  NUM_DECODER_LAYERS = 64
  DROPOUT = 0.1
  INPUT_DROPOUT = 0.1
  NUM_PARTITIONS = 16
  NUM_MICRO_BATCHES = 64
  CLIP_GRADIENT_NORM = 1.0
  MAX_STEPS = 500000
  EVAL_STEPS = 20
