"""TransformerGPipeBase: the shared recipe of the registered MT models.

Not registered itself. A model subclasses it and sets the class attributes
(the knobs below); `Task()` builds a TransformerMT whose stack is one
PipeliningLayer over the whole encoder-decoder (transformer.py), cut into
NUM_PARTITIONS cells balanced by flops for one micro-batch of
BATCH_SIZE / NUM_MICRO_BATCHES sentences of MAX_LENGTH tokens.

The model's vocabulary size is the input's max_vocab_size (VOCAB_SIZE): the
vocabulary MTInput builds (sentencepiece subwords, or words: TOKENIZER)
has at most that many ids, so every id fits. A smaller built vocabulary
leaves some rows of the table unused.

To try other sizes, subclass and change the knobs:

  class Wider(synthetic.TransformerTinyGPipe):
    MODEL_DIM = 128
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from lingvo_pipe.core import base_input_generator
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import lr_schedule
from lingvo_pipe.core import optimizer
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.tasks.mt import input_generator
from lingvo_pipe.tasks.mt import model
from lingvo_pipe.tasks.mt import multilingual_input
from lingvo_pipe.tasks.mt import transformer


# Length buckets of Lingvo's WMT14 recipe: bounds about 1.4x apart, up to
# 98 subwords (the WMT and folder models' BUCKET_UPPER_BOUND).
WMT14_BUCKETS = (10, 14, 19, 26, 36, 50, 70, 98)


class TransformerGPipeBase:
  """Knobs and the Task/Train/Dev/Test recipe (module docstring)."""

  # Data.
  DATASET = ''
  SOURCE_KEY = 'src'
  TARGET_KEY = 'tgt'
  # Multilingual: (dataset or None for DATASET, source, target, weight) per
  # language pair (multilingual_input.py); then SOURCE/TARGET_KEY unused.
  PAIRS: Optional[list] = None
  DATA_DIR: Optional[str] = None
  VOCAB_SIZE = 32000
  TOKENIZER = 'subword'  # MTInput.tokenizer: sentencepiece, shared by sides
  MAX_LENGTH = 64
  # Length buckets of the training input (MTInput): the longest pair of
  # each, and TokensPerBatch's budget for their batch sizes (multiples of
  # NUM_MICRO_BATCHES; 0: BATCH_SIZE x MAX_LENGTH, the padded batch's
  # tokens). () trains on BATCH_SIZE pairs padded to MAX_LENGTH.
  BUCKET_UPPER_BOUND: Tuple[int, ...] = ()
  TOKENS_PER_BATCH = 0
  # The same for evaluation and decoding, each batch at most
  # EVAL_BATCH_SIZE x MAX_LENGTH tokens; the decoder then writes up to the
  # last bound's tokens (at least MAX_LENGTH), in the split's order. Off in
  # the registered models: each bucket is one more trace of the decode step
  # (the eval step is traced once for all), and one decode length serves
  # every bucket.
  EVAL_BUCKET_UPPER_BOUND: Tuple[int, ...] = ()
  # The stack's input holds the embedded sentences, made from variables:
  # its first partition makes their gradient (the planner reads this).
  PIPELINE_INPUT_GRADIENT = True
  BATCH_SIZE = 64
  EVAL_BATCH_SIZE = 64
  SHUFFLE_BUFFER_SIZE = 10000
  DEV_SPLIT = 'validation'
  TEST_SPLIT = 'test'
  # Network.
  MODEL_DIM = 512
  HIDDEN_DIM = 2048
  NUM_HEADS = 8
  NUM_ENCODER_LAYERS = 6
  NUM_DECODER_LAYERS = 6
  DROPOUT = 0.1
  ATTEN_DROPOUT = 0.0
  RELU_DROPOUT = 0.0
  INPUT_DROPOUT = 0.1
  LABEL_SMOOTHING = 0.1
  # Pipeline.
  NUM_PARTITIONS = 2
  NUM_MICRO_BATCHES = 4
  RECOMPUTE = 'always'
  # The order of the actions in training (schedules/registry.py's Names(),
  # or a table's .csv file), and V, the stages per device (K x V cells:
  # 2 or more for 'interleaved_1f1b', 2 for 'zb_v').
  SCHEDULE = 'gpipe'
  NUM_VIRTUAL_STAGES = 1
  # Training.
  LEARNING_RATE = 1e-3
  WARMUP_STEPS = 4000
  ADAM_BETA2 = 0.98
  ADAM_EPSILON = 1e-9
  CLIP_GRADIENT_NORM = 0.0
  MAX_STEPS = 100000
  SAVE_INTERVAL_STEPS = 1000
  EVAL_INTERVAL_STEPS = 1000
  EVAL_STEPS = 10
  SEED = 1

  def _Input(self, split: str, training: bool) -> hyperparams.Params:
    if self.PAIRS:
      p = multilingual_input.MultilingualMTInput.Params().Set(
          pairs=[tuple(pair) for pair in self.PAIRS])
    else:
      p = input_generator.MTInput.Params().Set(
          source_key=self.SOURCE_KEY, target_key=self.TARGET_KEY)
    return p.Set(
        name=split, dataset_name=self.DATASET, data_dir=self.DATA_DIR,
        split=split,
        batch_size=self.BATCH_SIZE if training else self.EVAL_BATCH_SIZE,
        max_length=self.MAX_LENGTH, max_vocab_size=self.VOCAB_SIZE,
        tokenizer=self.TOKENIZER,
        shuffle_buffer_size=self.SHUFFLE_BUFFER_SIZE if training else 0,
        repeat=training, seed=self.SEED, **self._Buckets(training))

  def _Buckets(self, training: bool = True) -> Dict[str, List[int]]:
    """An input's bucket params; {} without buckets."""
    bounds = list(self.BUCKET_UPPER_BOUND if training else
                  self.EVAL_BUCKET_UPPER_BOUND)
    if not bounds:
      return {}
    tokens = ((self.TOKENS_PER_BATCH or self.BATCH_SIZE * self.MAX_LENGTH)
              if training else self.EVAL_BATCH_SIZE * self.MAX_LENGTH)
    return dict(bucket_upper_bound=bounds,
                bucket_batch_limit=input_generator.TokensPerBatch(
                    bounds, tokens, self.NUM_MICRO_BATCHES))

  def Train(self) -> hyperparams.Params:
    return self._Input('train', training=True)

  def Dev(self) -> hyperparams.Params:
    return self._Input(self.DEV_SPLIT, training=False)

  def Test(self) -> hyperparams.Params:
    return self._Input(self.TEST_SPLIT, training=False)

  def Stack(self) -> hyperparams.Params:
    """The pipelined encoder-decoder (transformer.py)."""
    layer_params = transformer.TransformerLayers(
        self.NUM_ENCODER_LAYERS, self.NUM_DECODER_LAYERS, self.MODEL_DIM,
        self.HIDDEN_DIM, self.NUM_HEADS, dropout_prob=self.DROPOUT,
        atten_dropout_prob=self.ATTEN_DROPOUT,
        relu_dropout_prob=self.RELU_DROPOUT)
    return transformer.PipelinedStack(
        layer_params, self.NUM_PARTITIONS, self.NUM_MICRO_BATCHES,
        input_shapes=self.MicroBatchInputShapes(), recompute=self.RECOMPUTE,
        schedule=self.SCHEDULE, num_virtual_stages=self.NUM_VIRTUAL_STAGES)

  def MicroBatchInputShapes(self, bucket: Optional[Tuple[int, int]] = None
                            ) -> NestedMap:
    """Shapes of the stack's input state for one training micro-batch:
    of the length `bucket` (bound, batch) if given, else of the bucket
    whose batch holds the most tokens, or of the padded batch."""
    batch, length = self.BATCH_SIZE, self.MAX_LENGTH
    bucket = bucket or base_input_generator.LargestBucket(self.Train())
    if bucket:
      length, batch = bucket
    micro_batch = max(1, batch // self.NUM_MICRO_BATCHES)
    return transformer.StateShapes(micro_batch, length, length,
                                   self.MODEL_DIM)

  def Task(self) -> hyperparams.Params:
    p = model.TransformerMT.Params().Set(
        src_vocab_size=self.VOCAB_SIZE, tgt_vocab_size=self.VOCAB_SIZE,
        shared_embedding=True, model_dim=self.MODEL_DIM, stack=self.Stack(),
        input_dropout_prob=self.INPUT_DROPOUT,
        label_smoothing=self.LABEL_SMOOTHING, random_seed=self.SEED,
        pair_names=[multilingual_input.PairName(pair)
                    for pair in self.PAIRS or []])
    if self.EVAL_BUCKET_UPPER_BOUND:
      p.max_decode_length = max(self.MAX_LENGTH,
                                self.EVAL_BUCKET_UPPER_BOUND[-1])
    tp = p.train
    tp.optimizer = optimizer.Adam.Params().Set(
        beta1=0.9, beta2=self.ADAM_BETA2, epsilon=self.ADAM_EPSILON)
    tp.learning_rate = self.LEARNING_RATE
    tp.lr_schedule = lr_schedule.LinearWarmupRsqrtDecay.Params().Set(
        warmup_steps=self.WARMUP_STEPS)
    tp.clip_gradient_norm_to_value = self.CLIP_GRADIENT_NORM
    tp.max_steps = self.MAX_STEPS
    tp.save_interval_steps = self.SAVE_INTERVAL_STEPS
    tp.eval_interval_steps = self.EVAL_INTERVAL_STEPS
    tp.eval_steps = self.EVAL_STEPS
    return p
