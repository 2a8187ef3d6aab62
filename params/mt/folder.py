"""Transformers on your own sentence pairs: a folder given with --data_dir.

  python -m lingvo_pipe.trainer --model=mt.folder.TransformerFolder \\
      --data_dir=/path/to/pairs --logdir=/tmp/lingvo_pipe/my_pairs

The folder holds one file per language and split, line i of each language
of a split being the same sentence (TFDS's TranslateFolder, read in place;
tasks/mt/folder_input.py):

  /path/to/pairs/de.train.txt   /path/to/pairs/en.train.txt
  /path/to/pairs/de.test.txt    /path/to/pairs/en.test.txt

With two languages, the first in alphabetical order is the source (de ->
en); to go the other way, or with more languages, set the train input's
(the others follow it):

  --model_params_override="train_input.source_key : 'en'
  train_input.target_key : 'de'"

Dev and Test read the test split. The sentencepiece vocabulary (at most
VOCAB_SIZE ids) is built from both training files on first use, into
<logdir>/vocab.txt. The folder is checked before the model is built
(missing or misaligned files, each problem one line).
"""

from __future__ import annotations

from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import model_registry
from lingvo_pipe.tasks.mt import folder_input
from params.mt import base
from params.mt import synthetic


class _Folder(base.TransformerGPipeBase):
  """The data of the folder models: TranslateFolderInput on --data_dir."""

  DATASET = folder_input.NAME
  SOURCE_KEY = None  # found from the files (module docstring)
  TARGET_KEY = None
  DEV_SPLIT = 'test'
  TEST_SPLIT = 'test'
  TOKENIZER = 'subword'
  BUCKET_UPPER_BOUND = base.WMT14_BUCKETS  # pairs of up to 98 subwords

  def _Input(self, split: str, training: bool) -> hyperparams.Params:
    """base's input params, read by TranslateFolderInput."""
    mt = super()._Input(split, training)
    p = folder_input.TranslateFolderInput.Params()
    return p.Set(**{k: v for k, v in mt.IterParams() if k != 'cls'})


@model_registry.RegisterSingleTaskModel
class TransformerFolder(_Folder):
  """Transformer base (6 + 6 layers, d=512, 8 heads), K=2, M=4.

  A 16k-id sentencepiece vocabulary shared by both sides; training pairs
  of up to 98 subwords in length buckets of at most 64 x 64 tokens a batch
  (base.WMT14_BUCKETS); Adam with 4000 steps of warm-up, 100k steps.
  """

  VOCAB_SIZE = 16000


@model_registry.RegisterSingleTaskModel
class TransformerTinyFolder(_Folder, synthetic.TransformerTinyGPipe):
  """mt.synthetic.TransformerTinyGPipe on your pairs: 2 + 2 layers, d=64,
  K=2, M=4 micro-batches of 8; a first try on a CPU.

  A 4000-id vocabulary (fewer for a small corpus); training pairs of up
  to 98 subwords in length buckets of at most 32 x 32 tokens a batch
  (base.WMT14_BUCKETS), evaluation pairs of up to 32; dropout 0.1;
  2000 steps.
  """

  VOCAB_SIZE = 4000
  MAX_LENGTH = 32
  EVAL_BATCH_SIZE = 16
  DROPOUT = 0.1
  INPUT_DROPOUT = 0.1
  MAX_STEPS = 2000
  SAVE_INTERVAL_STEPS = 500
  EVAL_INTERVAL_STEPS = 500
  EVAL_STEPS = 10
