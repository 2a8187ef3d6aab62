"""Length buckets against padding to the maximum, on WMT-shaped lengths.

  .venv/bin/python -m bench.mt_buckets.run [--steps=150] [--pairs=20000]
      [--json_out=FILE] [--picture=FILE.svg] [--model=NAME]

The corpus (made here, in a temporary folder, TranslateFolder's layout):
`--pairs` sentence pairs over 700 + 700 made-up words (so the subword
vocabulary keeps words whole), each target word standing for one source
word. Target lengths in words follow the shape of WMT14 En-De's in
subwords: a gamma distribution (shape 2.2) with mean 0.4 of the last
bucket's bound (98), at least 1 and at most 99; the source holds the
target's words in the source language, cut or extended with random words
to a length within 20% of the target's.

The model, as registered (`--model`, default mt.folder.TransformerTinyFolder:
2 + 2 layers, d=64, K=2, M=4, GPipe, recompute 'always'), trains twice on
the same pairs, in the same order, from the same weights:

  buckets   its own buckets: bounds 10 ... 98, batches of at most
            TOKENS_PER_BATCH tokens (pairs a multiple of M)
  padded    one bucket of 98: every batch padded to the maximum, the same
            token budget (its pairs rounded down to a multiple of M)

Each run is its own process (the trainer's --run_locally=cpu devices,
two logical CPUs of this process), one after the other. The first step of
each batch shape (its trace) is not timed; then `--steps` steps are.
Reported: real (non-pad) target tokens per second (their sum over the
timed steps over the time), the ratio buckets / padded (target >= 1.7),
the training loss against real target tokens seen (the picture; and the
mean loss of both runs over the 10 steps up to the padded run's last
count), and the largest batch each run met, in token slots and attention
entries (what a device's activations grow with: the buckets' largest is
the padded batch).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

_BOUND = 98
_WORDS = 700


def _Word(rng: np.random.Generator, letters: str) -> str:
  return ''.join(rng.choice(list(letters), rng.integers(3, 8)))


def MakeCorpus(root: str, pairs: int, seed: int = 5) -> dict:
  """Writes de/en .train and .test files under `root`; their lengths."""
  rng = np.random.default_rng(seed)
  src_words = sorted({_Word(rng, 'bcdfghklmnprstvz') for _ in range(3 * _WORDS)}
                     )[:_WORDS]
  tgt_words = sorted({_Word(rng, 'aeiouwxyjq') + _Word(rng, 'bdgkt')
                      for _ in range(3 * _WORDS)})[:_WORDS]
  lengths = []
  for split, n in (('train', pairs), ('test', 200)):
    src_lines, tgt_lines = [], []
    for _ in range(n):
      t = int(np.clip(round(rng.gamma(2.2, 0.4 * _BOUND / 2.2)), 1, 99))
      ids = rng.integers(0, _WORDS, t)
      s = int(np.clip(round(t * rng.uniform(0.8, 1.2)), 1, 99))
      src = [src_words[i] for i in ids][:s] + [
          src_words[i] for i in rng.integers(0, _WORDS, max(0, s - t))]
      tgt_lines.append(' '.join(tgt_words[i] for i in ids))
      src_lines.append(' '.join(src))
      lengths.append(t)
    for lang, lines in (('de', src_lines), ('en', tgt_lines)):
      with open(os.path.join(root, f'{lang}.{split}.txt'), 'w') as f:
        f.write('\n'.join(lines) + '\n')
  return {'mean_target_words': float(np.mean(lengths)),
          'max_target_words': int(np.max(lengths))}


def RunOne(model: str, mode: str, root: str, logdir: str, steps: int
           ) -> dict:
  """One run, in this process (the `--mode` child)."""
  from lingvo_pipe import trainer  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core import quiet  # pylint: disable=g-import-not-at-top
  tf = quiet.ImportTensorFlow()
  p = trainer.LoadParams(model, data_dir=root)
  trainer.VocabularyInLogdir(p, logdir)
  m = p.task.stack.num_micro_batches
  if mode == 'padded':
    bounds = p.train_input.bucket_upper_bound
    limits = p.train_input.bucket_batch_limit
    tokens = max(b * n for b, n in zip(bounds, limits))
    p.train_input.bucket_upper_bound = [_BOUND]
    p.train_input.bucket_batch_limit = [max(m, tokens // _BOUND // m * m)]
  trainer.CheckBatches(p)
  from lingvo_pipe.core import base_model  # pylint: disable=g-import-not-at-top
  trainer.SetUpDevices('cpu', base_model.NumDevicesNeeded(p.task))
  task = p.task.Instantiate()
  task.CreateTrainState()
  step_fn = tf.function(task.TrainStep, autograph=False)
  batches = iter(p.train_input.Instantiate().GetDataset())
  shapes, curve, timed = set(), [], []
  seen_tokens = 0.0
  while len(timed) < steps:
    batch = next(batches)
    batch.pop('dropped_long', None)
    shape = tuple(batch.src.ids.shape) + tuple(batch.tgt.ids.shape[1:])
    real = float(tf.reduce_sum(batch.tgt.weights))
    start = time.perf_counter()
    loss = float(step_fn(batch)['loss'])
    took = time.perf_counter() - start
    seen_tokens += real
    curve.append((seen_tokens, loss))
    if shape in shapes:
      timed.append((took, real))
    else:
      shapes.add(shape)
  secs = sum(t for t, _ in timed)
  return {'mode': mode, 'shapes': sorted(shapes), 'steps': len(timed),
          'seconds': secs, 'real_tokens': sum(r for _, r in timed),
          'tokens_per_sec': sum(r for _, r in timed) / secs,
          'curve': curve}


def Picture(runs: list) -> str:
  """Loss against real target tokens of each run, as SVG lines."""
  w, h, pad = 640, 360, 50
  xs = [x for r in runs for x, _ in r['curve']]
  ys = [y for r in runs for _, y in r['curve']]
  x1, y0, y1 = max(xs), min(ys), max(ys)
  def X(x): return pad + (w - 2 * pad) * x / x1  # noqa: E704
  def Y(y): return h - pad - (h - 2 * pad) * (y - y0) / (y1 - y0)  # noqa: E704
  parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" '
           f'height="{h}">', '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{w / 2}" y="20" text-anchor="middle">training loss '
           'against real target tokens seen</text>',
           f'<text x="{pad}" y="{h - 15}">0</text>',
           f'<text x="{w - pad}" y="{h - 15}" text-anchor="end">'
           f'{x1:,.0f} tokens</text>',
           f'<text x="5" y="{pad}">{y1:.2f}</text>',
           f'<text x="5" y="{h - pad}">{y0:.2f}</text>']
  for r, colour in zip(runs, ('#1f77b4', '#d62728')):
    pts = [(X(x), Y(y)) for x, y in r['curve']]
    for (ax, ay), (bx, by) in zip(pts, pts[1:]):
      parts.append(f'<line x1="{ax:.1f}" y1="{ay:.1f}" x2="{bx:.1f}" '
                   f'y2="{by:.1f}" stroke="{colour}"/>')
    label_y = 40 + 16 * runs.index(r)
    parts.append(f'<line x1="{w - 200}" y1="{label_y - 4}" x2="{w - 180}" '
                 f'y2="{label_y - 4}" stroke="{colour}"/>')
    parts.append(f'<text x="{w - 175}" y="{label_y}">{r["mode"]}</text>')
  return '\n'.join(parts + ['</svg>'])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--model', default='mt.folder.TransformerTinyFolder')
  parser.add_argument('--steps', type=int, default=150)
  parser.add_argument('--pairs', type=int, default=20000)
  parser.add_argument('--json_out', default='')
  parser.add_argument('--picture', default='')
  parser.add_argument('--mode', default='', help=argparse.SUPPRESS)
  parser.add_argument('--root', default='', help=argparse.SUPPRESS)
  parser.add_argument('--logdir', default='', help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.mode:
    print(json.dumps(RunOne(args.model, args.mode, args.root, args.logdir,
                            args.steps)))
    return
  with tempfile.TemporaryDirectory() as tmp:
    root, logdir = os.path.join(tmp, 'pairs'), os.path.join(tmp, 'run')
    os.makedirs(root)
    os.makedirs(logdir)
    corpus = MakeCorpus(root, args.pairs)
    runs = []
    for mode in ('buckets', 'padded'):
      out = subprocess.run(
          [sys.executable, '-m', 'bench.mt_buckets.run', f'--mode={mode}',
           f'--model={args.model}', f'--root={root}', f'--logdir={logdir}',
           f'--steps={args.steps}'], check=True, capture_output=True,
          text=True)
      runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
  print(f'{args.model}; corpus: {args.pairs} pairs, target length mean '
        f'{corpus["mean_target_words"]:.1f} words (max '
        f'{corpus["max_target_words"]}), buckets up to {_BOUND}')
  print('| run | batch shapes seen (pairs x length) | real target tokens/s '
        '| largest batch: slots, attention entries b x t^2 |')
  print('|---|---|---|---|')
  for r in runs:
    shapes = ', '.join(f'{s[0]}x{s[1]}' for s in r['shapes'])
    slots = max(s[0] * max(s[1], s[2]) for s in r['shapes'])
    atten = max(s[0] * max(s[1], s[2])**2 for s in r['shapes'])
    print(f'| {r["mode"]} | {shapes} | {r["tokens_per_sec"]:,.0f} | '
          f'{slots:,}, {atten:,} |')
  ratio = runs[0]['tokens_per_sec'] / runs[1]['tokens_per_sec']
  print(f'- buckets / padded, real target tokens per second: {ratio:.2f}x '
        f'(target >= 1.7: {"ok" if ratio >= 1.7 else "MISS"})')
  # The same quality for the same real tokens: each run's loss over the
  # 10 steps up to the padded run's last count.
  upto = runs[1]['curve'][-1][0]
  for r in runs:
    tail = [loss for seen, loss in r['curve'] if seen <= upto][-10:]
    print(f'- {r["mode"]}: loss {np.mean(tail):.3f} +- {np.std(tail):.3f} '
          f'(mean, sd of the 10 steps up to {upto:,.0f} real target tokens)'
          + (f'; {r["curve"][-1][1]:.3f} at its last step, '
             f'{r["curve"][-1][0]:,.0f} tokens' if r is runs[0] else ''))
  if args.picture:
    with open(args.picture, 'w') as f:
      f.write(Picture(runs))
  if args.json_out:
    with open(args.json_out, 'w') as f:
      json.dump({'corpus': corpus, 'runs': runs, 'ratio': ratio}, f)


if __name__ == '__main__':
  main()
