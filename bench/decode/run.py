"""Decoding time per token: cached beam search against the uncached decoder.

  .venv/bin/python -m bench.decode.run [--lengths=16,128] [--rounds=5]
      [--json_out=FILE]

A TransformerMT (2 + 2 layers of Transformer-base's width: d=512, ff 2048,
8 heads; 8000 shared subword ids; random weights, float32) decodes a batch
of 8 source sentences of 16 tokens to a target length T, on this
process's CPU:

  cached greedy    beam size 1 over the layers' cached keys and values
                   (transformer_layers.ExtendStep): step t costs O(T)
  cached beam 4    beam size 4, length_alpha 0.6: 4x the rows
  uncached greedy  decoder.GreedyDecodeUncached: step t re-runs the
                   decoder over the whole [b, T] prefix, O(T^2) in all

The </s> row of the (tied) embedding is zeroed, so its logit is exactly 0
while the best of 8000 random logits is positive: no hypothesis ends, and
every mode decodes exactly T tokens. Each DecodeStep is one traced
tf.function (traced and run twice before timing). Rounds interleave the
configurations; the table has the median time over rounds, the time per
token (median / T), and per mode the ratio of per-token time at the
longest T to the shortest (target for the cache: <= 1.5x). Nothing else
should run meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from bench.common import cli  # noqa: E402
from lingvo_pipe.core import quiet  # noqa: E402

tf = quiet.ImportTensorFlow()
tf.get_logger().setLevel('ERROR')  # six tasks' traced DecodeSteps: no
                                   # retracing warnings

import numpy as np  # noqa: E402

from lingvo_pipe.core.nested_map import NestedMap  # noqa: E402
from lingvo_pipe.tasks.mt import model  # noqa: E402
from lingvo_pipe.tasks.mt import tokenizer  # noqa: E402
from lingvo_pipe.tasks.mt import transformer  # noqa: E402

_VOCAB, _DIM, _BATCH, _SRC = 8000, 512, 8, 16
_MODES = {'cached greedy': dict(beam_size=1, length_alpha=0.0),
          'cached beam 4': dict(beam_size=4, length_alpha=0.6),
          'uncached greedy': dict(beam_size=1, length_alpha=0.0,
                                  decode_cache=False)}


def _Decoder(mode: str, length: int):
  """A traced DecodeStep of a fresh task (same seed: same weights)."""
  layers = transformer.TransformerLayers(2, 2, _DIM, 4 * _DIM, 8)
  task = model.TransformerMT.Params().Set(
      name='mt', src_vocab_size=_VOCAB, tgt_vocab_size=_VOCAB,
      model_dim=_DIM, stack=transformer.SequentialStack(layers),
      max_decode_length=length, random_seed=5, **_MODES[mode]).Instantiate()
  table = task.theta.emb.w
  table.assign(tf.tensor_scatter_nd_update(
      table, [[tokenizer.EOS_ID]], tf.zeros([1, _DIM])))
  rng = np.random.default_rng(0)
  src = rng.integers(4, _VOCAB, [_BATCH, _SRC]).astype(np.int32)
  batch = NestedMap(src=NestedMap(ids=tf.constant(src),
                                  paddings=tf.zeros([_BATCH, _SRC])))
  fn = tf.function(task.DecodeStep, autograph=False)
  for _ in range(2):
    out = fn(batch)
  lengths = out.hyp_lengths.numpy()
  if not np.all(lengths == length):
    raise RuntimeError(f'{mode}: decoded lengths {lengths}, not {length}.')
  return lambda: fn(batch).hyp_ids.numpy()


def _Time(fn) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def Main() -> None:
  parser = argparse.ArgumentParser(prog=cli.Prog(),
                                   description=__doc__.splitlines()[0])
  parser.add_argument('--lengths', default='16,128')
  parser.add_argument('--rounds', type=int, default=5)
  parser.add_argument('--json_out', default='')
  args = parser.parse_args()
  lengths = [int(x) for x in args.lengths.split(',')]
  configs = [(mode, t) for mode in _MODES for t in lengths]
  fns = {c: _Decoder(*c) for c in configs}
  times = {c: [] for c in configs}
  for r in range(args.rounds):
    for i in range(len(configs)):
      c = configs[(i + r) % len(configs)]
      times[c].append(_Time(fns[c]))
  print(f'Model: TransformerMT 2 + 2 layers, d={_DIM}, ff {4 * _DIM}, 8 '
        f'heads, vocabulary {_VOCAB}, batch {_BATCH}, source {_SRC} tokens, '
        f'float32; {args.rounds} interleaved rounds.')
  print('| mode | T | decode (median) | per token | per token vs T='
        f'{lengths[0]} |')
  print('|---|---|---|---|---|')
  rows = []
  for mode in _MODES:
    base = None
    for t in lengths:
      median = statistics.median(times[(mode, t)])
      per_token = median / t
      base = base or per_token
      rows.append(dict(mode=mode, length=t, median_s=median,
                       per_token_ms=1e3 * per_token,
                       ratio=per_token / base))
      print(f'| {mode} | {t} | {median:.3f} s | {1e3 * per_token:.2f} ms | '
            f'{per_token / base:.2f}x |')
  if args.json_out:
    with open(args.json_out, 'w') as f:
      json.dump(rows, f, indent=1)


if __name__ == '__main__':
  Main()
