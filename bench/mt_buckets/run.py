"""Length buckets against padding to the maximum, on WMT-shaped lengths.

  .venv/bin/python -m bench.mt_buckets.run [--steps=150] [--pairs=20000]
      [--json_out=FILE] [--picture=FILE.svg] [--model=NAME]
      [--startup_model=NAME] [--startup_bounds=6,10,14]

The corpus (made here, in a temporary folder, TranslateFolder's layout):
`--pairs` sentence pairs over 700 + 700 made-up words (so the subword
vocabulary keeps words whole), each target word standing for one source
word. Target lengths in words follow the shape of WMT14 En-De's in
subwords: a gamma distribution (shape 2.2) with mean 0.4 of the last
bucket's bound (98), at least 1 and at most 99; the source holds the
target's words in the source language, cut or extended with random words
to a length within 20% of the target's.

The model, as registered (`--model`, default mt.folder.TransformerTinyFolder:
2 + 2 layers, d=64, K=2, M=4, GPipe, recompute 'always'), trains twice
on the same pairs, in the same order, from the same weights:

  buckets   its own buckets: bounds 10 ... 98, batches of at most
            TOKENS_PER_BATCH tokens (pairs a multiple of M), the step
            traced once for every bucket (as the trainer does by default)
  padded    one bucket of 98: every batch padded to the maximum, the same
            token budget (its pairs rounded down to a multiple of M)

Each run is its own process (the trainer's --run_locally=cpu devices,
two logical CPUs of this process), one after the other. The first step of
each batch shape is not timed; then `--steps` steps are.
Reported: real (non-pad) target tokens per second (their sum over the
timed steps over the time), the ratio buckets / padded (target >= 1.7),
the training loss against real target tokens seen (the picture; and the
mean loss of both runs over the 10 steps up to the padded run's last
count), the largest batch each run met, in token slots and attention
entries (what a device's activations grow with), and the process's peak
RSS over its RSS once the model was built (both logical devices, traced
graphs included).

The cost of one trace: in one process, one batch of each bucket, the
step traced once for every bucket and the step traced per shape
(task.train.one_trace_for_buckets=False) run in turn `--ab_reps` times;
each bucket's median step of each, and the graph ops of each (the step's
traced graph and its functions, before the runtime optimises them).

Start-up (`--startup_model`, default the README's MT model,
mt.synthetic.TransformerTinyGPipe, on its synthetic pairs): the first
step as registered (padded to its MAX_LENGTH), against the first step of
each bucket of `--startup_bounds` (batches of the padded batch's tokens)
summed, traced once and traced per shape (target: at most 2x).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any, List, Optional

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


def _SetBuckets(inp: Any, mode: str, bounds: Optional[List[int]],
                m: int) -> None:
  """The train input's buckets for `mode` (RunOne's docstring)."""
  from lingvo_pipe.tasks.mt import input_generator  # pylint: disable=g-import-not-at-top
  if mode == 'buckets' and bounds:
    inp.bucket_upper_bound = list(bounds)
    inp.bucket_batch_limit = input_generator.TokensPerBatch(
        bounds, inp.batch_size * inp.max_length, m)
  if mode == 'padded' and inp.bucket_upper_bound:
    tokens = max(b * n for b, n in zip(inp.bucket_upper_bound,
                                       inp.bucket_batch_limit))
    inp.bucket_upper_bound = [_BOUND]
    inp.bucket_batch_limit = [max(m, tokens // _BOUND // m * m)]


def RunOne(model: str, mode: str, root: str, logdir: str, steps: int,
           trace: str = 'once', bounds: Optional[List[int]] = None) -> dict:
  """One run, in this process (the `--mode` child).

  mode 'buckets': the model's buckets, or `bounds` with TokensPerBatch of
  its padded batch's tokens; 'padded': one bucket of the last bound of the
  same token budget, or the model as registered if it has no buckets.
  trace 'once': the step traced once for every shape, as the trainer does
  (base_input_generator.StepSpec); 'per_shape': traced for each shape.
  """
  from lingvo_pipe import trainer  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core import quiet  # pylint: disable=g-import-not-at-top
  tf = quiet.ImportTensorFlow()
  from lingvo_pipe.core import base_input_generator  # pylint: disable=g-import-not-at-top
  p = trainer.LoadParams(model, data_dir=root)
  trainer.VocabularyInLogdir(p, logdir)
  inp = p.train_input
  _SetBuckets(inp, mode, bounds, p.task.stack.num_micro_batches)
  trainer.CheckBatches(p)
  from lingvo_pipe.core import base_model  # pylint: disable=g-import-not-at-top
  trainer.SetUpDevices('cpu', base_model.NumDevicesNeeded(p.task))
  task = p.task.Instantiate()
  task.CreateTrainState()
  dataset = inp.Instantiate().GetDataset()
  spec = (base_input_generator.StepSpec(inp, dataset) if trace == 'once'
          else None)
  step_fn = tf.function(task.TrainStep, autograph=False,
                        input_signature=None if spec is None else [spec])
  batches = iter(dataset)
  built = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  shapes, curve, timed, firsts = set(), [], [], []
  seen_tokens = 0.0
  while len(timed) < steps:
    batch = next(batches)
    batch.pop(base_input_generator.DROPPED_LONG, None)
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
      firsts.append(took)
  secs = sum(t for t, _ in timed)
  return {'mode': mode, 'trace': trace, 'shapes': sorted(shapes),
          'steps': len(timed), 'seconds': secs,
          'real_tokens': sum(r for _, r in timed),
          'tokens_per_sec': sum(r for _, r in timed) / secs,
          'first_steps': firsts,
          'traces': step_fn.experimental_get_tracing_count(),
          'peak_mib': (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                       - built) / 1024,
          'curve': curve}


def TraceAB(model: str, root: str, logdir: str, reps: int) -> dict:
  """One process, one batch of each bucket: the step traced once for
  every bucket against traced per shape, the two alternating, each
  bucket's median seconds of each."""
  from lingvo_pipe import trainer  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core import quiet  # pylint: disable=g-import-not-at-top
  tf = quiet.ImportTensorFlow()
  from lingvo_pipe.core import base_input_generator  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core import base_model  # pylint: disable=g-import-not-at-top
  p = trainer.LoadParams(model, data_dir=root)
  trainer.VocabularyInLogdir(p, logdir)
  trainer.SetUpDevices('cpu', base_model.NumDevicesNeeded(p.task))
  task = p.task.Instantiate()
  task.CreateTrainState()
  dataset = p.train_input.Instantiate().GetDataset()
  spec = base_input_generator.StepSpec(p.train_input, dataset)
  steps = {'once': tf.function(task.TrainStep, autograph=False,
                               input_signature=[spec]),
           'per_shape': tf.function(task.TrainStep, autograph=False)}
  by_length = {}
  for batch in dataset.take(500):
    batch.pop(base_input_generator.DROPPED_LONG, None)
    by_length.setdefault(int(batch.src.ids.shape[1]), batch)
  times = {}
  for rep in range(reps + 1):  # the first round traces, not timed
    for name, fn in steps.items():
      for length, batch in sorted(by_length.items()):
        start = time.perf_counter()
        float(fn(batch)['loss'])
        if rep:
          times.setdefault(f'{length} {name}', []).append(
              time.perf_counter() - start)
  any_batch = next(iter(by_length.values()))
  graphs = {name: fn.get_concrete_function(spec if name == 'once' else
                                           any_batch).graph.as_graph_def()
            for name, fn in steps.items()}
  return {'shapes': {str(t): list(b.src.ids.shape)
                     for t, b in by_length.items()},
          'median': {k: float(np.median(v)) for k, v in times.items()},
          'graph_ops': {name: _OpCounts(g) for name, g in graphs.items()}}


def _OpCounts(graph_def: Any) -> dict:
  """{op type: count} over a graph and its function library."""
  counts: dict = {}
  nodes = list(graph_def.node)
  for function in graph_def.library.function:
    nodes += list(function.node_def)
  for node in nodes:
    counts[node.op] = counts.get(node.op, 0) + 1
  return counts


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


def _Child(model: str, mode: str, trace: str,
           steps: int, root: str, logdir: str, bounds: str = '') -> dict:
  """RunOne in its own process (its own devices and start-up)."""
  out = subprocess.run(
      [sys.executable, '-m', 'bench.mt_buckets.run', f'--mode={mode}',
       f'--trace={trace}', f'--model={model}', f'--root={root}',
       f'--logdir={logdir}', f'--steps={steps}', f'--bounds={bounds}'],
      check=True, capture_output=True, text=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def _Throughput(args: argparse.Namespace, tmp: str) -> None:
  """The WMT-shaped corpus: tokens a second, loss, largest batch."""
  root, logdir = os.path.join(tmp, 'pairs'), os.path.join(tmp, 'run')
  os.makedirs(root)
  os.makedirs(logdir)
  corpus = MakeCorpus(root, args.pairs)
  runs = [_Child(args.model, mode, 'once', args.steps, root, logdir)
          for mode in ('buckets', 'padded')]
  ab = _Child(args.model, 'ab', '', args.ab_reps, root, logdir)
  print(f'{args.model}; corpus: {args.pairs} pairs, target length mean '
        f'{corpus["mean_target_words"]:.1f} words (max '
        f'{corpus["max_target_words"]}), buckets up to {_BOUND}')
  print('| run | step traced | batch shapes seen (pairs x length) | real '
        'target tokens/s | largest batch: slots, attention entries b x t^2 '
        '| peak RSS over the built model |')
  print('|---|---|---|---|---|---|')
  for r in runs:
    shapes = ', '.join(f'{s[0]}x{s[1]}' for s in r['shapes'])
    slots = max(s[0] * max(s[1], s[2]) for s in r['shapes'])
    atten = max(s[0] * max(s[1], s[2])**2 for s in r['shapes'])
    print(f'| {r["mode"]} | {_TRACE[r["trace"]]} ({r["traces"]}) | {shapes} '
          f'| {r["tokens_per_sec"]:,.0f} | {slots:,}, {atten:,} | '
          f'{r["peak_mib"]:.0f} MiB |')
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
  print(f'\nOne trace for every bucket against one per shape, {args.model}, '
        f'one process, alternating, median of {args.ab_reps}:')
  print('| bucket (pairs x length) | traced once | traced per shape | once / '
        'per shape |')
  print('|---|---|---|---|')
  med = ab['median']
  for t, shape in sorted(ab['shapes'].items(), key=lambda kv: int(kv[0])):
    once, per = med[f'{t} once'], med[f'{t} per_shape']
    print(f'| {shape[0]}x{shape[1]} | {once * 1e3:.1f} ms | {per * 1e3:.1f} '
          f'ms | {once / per:.2f}x |')
  total = [sum(v for k, v in med.items() if k.endswith(name))
           for name in (' once', ' per_shape')]
  print('- a step of each bucket, summed: traced once '
        f'{total[0] / total[1]:.2f}x the time of traced per shape')
  ops = ab['graph_ops']
  print('- graph ops of the step (its functions included): traced once '
        f'{sum(ops["once"].values()):,}, per shape (one shape) '
        f'{sum(ops["per_shape"].values()):,}; of them Shape '
        f'{ops["once"].get("Shape", 0)} and {ops["per_shape"].get("Shape", 0)}'
        ', BroadcastGradientArgs '
        f'{ops["once"].get("BroadcastGradientArgs", 0)} and '
        f'{ops["per_shape"].get("BroadcastGradientArgs", 0)}')
  if args.picture:
    with open(args.picture, 'w') as f:
      f.write(Picture(runs))
  if args.json_out:
    with open(args.json_out, 'w') as f:
      json.dump({'corpus': corpus, 'runs': runs, 'ratio': ratio, 'ab': ab},
                f)


_TRACE = {'once': 'once', 'per_shape': 'per shape'}


def _StartUp(args: argparse.Namespace, tmp: str) -> None:
  """The README's MT model: its single first step against the first step
  of each bucket, summed."""
  root, logdir = os.path.join(tmp, 'synthetic'), os.path.join(tmp, 'run2')
  os.makedirs(root)
  os.makedirs(logdir)
  _Child(args.startup_model, 'padded', 'once', 2, root, logdir)  # data
  runs = [_Child(args.startup_model, mode, trace, args.startup_steps,
                 root, logdir, args.startup_bounds)
          for mode, trace in (('padded', 'once'), ('buckets', 'once'),
                              ('buckets', 'per_shape'))]
  print(f'\nStart-up, {args.startup_model} (buckets '
        f'{args.startup_bounds}):')
  print('| run | step traced | first step of each shape | in all | against '
        'padded |')
  print('|---|---|---|---|---|')
  base = sum(runs[0]['first_steps'])
  for r in runs:
    firsts = ' + '.join(f'{t:.2f}' for t in r['first_steps'])
    total = sum(r['first_steps'])
    print(f'| {r["mode"]} | {_TRACE[r["trace"]]} ({r["traces"]}) | '
          f'{firsts} s | {total:.2f} s | {total / base:.2f}x |')
  ratio = sum(runs[1]['first_steps']) / base
  print(f'- buckets (traced once) / padded, first steps in all: {ratio:.2f}x '
        f'(target <= 2: {"ok" if ratio <= 2 else "MISS"})')


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--model', default='mt.folder.TransformerTinyFolder')
  parser.add_argument('--steps', type=int, default=150)
  parser.add_argument('--pairs', type=int, default=20000)
  parser.add_argument('--startup_model',
                      default='mt.synthetic.TransformerTinyGPipe')
  parser.add_argument('--startup_bounds', default='6,10,14')
  parser.add_argument('--startup_steps', type=int, default=20)
  parser.add_argument('--ab_reps', type=int, default=9)
  parser.add_argument('--json_out', default='')
  parser.add_argument('--picture', default='')
  parser.add_argument('--mode', default='', help=argparse.SUPPRESS)
  parser.add_argument('--trace', default='once', help=argparse.SUPPRESS)
  parser.add_argument('--bounds', default='', help=argparse.SUPPRESS)
  parser.add_argument('--root', default='', help=argparse.SUPPRESS)
  parser.add_argument('--logdir', default='', help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.mode == 'ab':
    print(json.dumps(TraceAB(args.model, args.root, args.logdir,
                                    args.steps)))
    return
  if args.mode:
    bounds = [int(b) for b in args.bounds.split(',') if b]
    print(json.dumps(RunOne(args.model, args.mode, args.root, args.logdir,
                            args.steps, args.trace, bounds)))
    return
  with tempfile.TemporaryDirectory() as tmp:
    _Throughput(args, tmp)
    _StartUp(args, tmp)


if __name__ == '__main__':
  main()
