"""Peak activation memory per device of each schedule, at a fixed
micro-batch size.

  .venv/bin/python -m bench.memory.run schedules [--ms=8,32]
      [--modes=never,always] [--split=both|whole|split] [--micro_batch=4]
      [--schedules=gpipe,1f1b,...] [--repeats=1] [--json_out=FILE]

bench/common's Transformer stack (8 encoder layers, d=128, ff=512, 4
heads, seq 64) on K=2 devices, micro-batches of --micro_batch sequences
(so the batch is M x micro-batch), for each recompute mode, M and
schedule (--schedules, all by default): 'gpipe', '1f1b',
'interleaved_1f1b' with V=2 (four stages of two layers, stage s on
device s mod 2), 'zb_v' (V=2: stages 0 and 3 on device 0, 1 and 2 on
device 1) and 'looped_bfs' (V=2, placed as interleaved). With recompute
'never' each schedule also runs with its backwards split ('split':
PipeliningLayer.split_backward, each B then its W; --split chooses); a
schedule whose definition splits them (ZB-V) runs once, in 'never'
only (its rules: `registry.Check`).

Each configuration is probed in a fresh process as table1.py probes a
size (`table1.Probe`): two `tf.distribute.Server` workers with the BFC
allocator, one training step as the trainer's one pass (FPropWithLoss in
the schedule's order, every gradient, an Adam update) to warm up, then
one more; a device's activation is its allocator's peak during that step
minus what it held before it (activations kept for the backward, the
re-computation's working set, gradients, temporaries; not the
parameters and Adam's slots). The batch comes from the client, so device
0's figure also holds the batch it receives, which grows with M here.
With --repeats=N, N probes and the one with the median worst device
counts.

The table's last column is what the schedule's table alone predicts
(`schedule.InFlight`): the most layer activations a device holds at once
between a forward and its backward, in layers x micro-batches (a stage of
L/(KV) layers holding a micro-batch counts L/(KV)). GPipe holds every
micro-batch; 1F1B holds at most K-k on device k; interleaved holds
2(K-1-k) + (V-1)K + 1 stages of 1/V the size.

Targets (at K=2, M=32, recompute 'never'): 1F1B's worst device's
activation peak is at most 1/4 of GPipe's; and 1F1B at M=32 is within
1.2x of 1F1B at M=8 (its peak does not grow with M); each judged with
whole backwards and with split ones (both against GPipe's whole).
ZB-V's worst device at most 1.15x 1F1B's, judged against 1F1B whole and
against 1F1B split. Looped BFS's worst device is printed beside GPipe's
(no target: it holds every micro-batch, as GPipe).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from lingvo_pipe.core import quiet  # noqa: E402

quiet.ImportTensorFlow()  # before the modules below import it

from bench.common import cli  # noqa: E402
from bench.memory import table1  # noqa: E402
from lingvo_pipe.core import schedule as schedule_lib  # noqa: E402
from lingvo_pipe.core.schedules import registry  # noqa: E402

K = 2
SCHEDULES = (('gpipe', 1), ('1f1b', 1), ('interleaved_1f1b', 2),
             ('zb_v', 2), ('looped_bfs', 2))
STACK = dict(num_layers=8, model_dim=128, hidden_dim=512, num_heads=4,
             seq_len=64)
QUARTER_TARGET = 0.25  # 1F1B / GPipe worst device, K=2 M=32 'never'
FLAT_TARGET = 1.2  # 1F1B M=32 / M=8 worst device, 'never'
ZB_V_TARGET = 1.15  # ZB-V / 1F1B worst device, K=2 M=32 'never'


@dataclasses.dataclass(frozen=True)
class Config:
  schedule: str
  v: int
  recompute: str
  m: int
  split: bool = False  # PipeliningLayer.split_backward

  @property
  def name(self) -> str:
    return ((self.schedule if self.v == 1
             else f'{self.schedule} V={self.v}') +
            (', split' if self.split else ''))

  def SetupText(self) -> str:
    """bench/common's Setup.ToText of this configuration."""
    return (f'pipe,{K},{self.m},{self.recompute},{self.schedule},{self.v}'
            + (',split' if self.split else ''))


def HeldLayers(config: Config) -> List[int]:
  """Per device: most layer x micro-batch activations held (docstring)."""
  table = registry.Make(config.schedule, K, config.m, config.v,
                        config.split)
  _, device_peak = schedule_lib.InFlight(table)
  per_stage = STACK['num_layers'] // (K * config.v)
  return [n * per_stage for n in device_peak]


def _ProbeMain(args: argparse.Namespace) -> None:
  """The probe process: one configuration (--setup, --micro_batch)."""
  from bench.common import stack as stack_lib  # pylint: disable=g-import-not-at-top
  setup = stack_lib.Setup.FromText(args.setup)
  stack = stack_lib.Stack(batch=setup.m * args.micro_batch, **STACK)

  def Build(devices: List[str]) -> Tuple[object, object]:
    return (stack_lib.BuildModel(stack, setup, devices),
            stack_lib.Inputs(stack))

  table1.PrintProbe(table1.Probe(setup.k, Build))


def Measure(config: Config, args: argparse.Namespace) -> dict:
  """--repeats probes of `config`; the one of the median worst device."""
  command = [sys.executable, '-m', 'bench.memory.schedules', '--probe',
             f'--setup={config.SetupText()}',
             f'--micro_batch={args.micro_batch}']
  runs = sorted((table1.RunProbe(command, config.SetupText(), args.timeout)
                 for _ in range(args.repeats)),
                key=lambda r: max(r['activation_mib']))
  rec = dict(runs[(len(runs) - 1) // 2])
  rec['worst_of_runs'] = [max(r['activation_mib']) for r in runs]
  return rec


def _Worst(rec: dict) -> Tuple[int, float]:
  act = rec['activation_mib']
  d = max(range(len(act)), key=act.__getitem__)
  return d, act[d]


def Table(results: Dict[Config, dict], micro_batch: int) -> str:
  lines = ['| schedule | recompute | M | batch | activation MiB per device '
           '| worst device (MiB) | layers x micro-batches held, per device '
           '(table) |', '|---|---|---|---|---|---|---|']
  for config, rec in results.items():
    d, worst = _Worst(rec)
    runs = rec['worst_of_runs']
    spread = (' (median of ' + ', '.join(f'{w:.1f}' for w in runs) + ')'
              if len(runs) > 1 else '')
    lines.append(
        f'| {config.name} | {config.recompute} | {config.m} | '
        f'{config.m * micro_batch} | ' +
        ', '.join(f'{a:.1f}' for a in rec['activation_mib']) +
        f' | {d} ({worst:.1f}){spread} | ' +
        ', '.join(str(n) for n in HeldLayers(config)) + ' |')
  return '\n'.join(lines)


def Targets(results: Dict[Config, dict]) -> List[str]:
  """The target lines, whole and split, 'ok' or 'MISS' (module docstring)."""
  def Worst(schedule: str, m: int, split: bool = False) -> float:
    return _Worst(results[Config(schedule, 1, 'never', m, split)])[1]

  lines = []
  m_hi, m_lo = 32, 8
  for split in (False, True):
    what = '1F1B, backwards split' if split else '1F1B'
    if Config('1f1b', 1, 'never', m_hi, split) not in results:
      continue
    try:
      gpipe, ofob = Worst('gpipe', m_hi), Worst('1f1b', m_hi, split)
      ratio = ofob / gpipe
      lines.append(
          f'K={K} M={m_hi} never: {what} worst device {ofob:.1f} MiB, GPipe '
          f'{gpipe:.1f} MiB: {ratio:.3f} of it (target at most '
          f'{QUARTER_TARGET:g}): '
          f'{"ok" if ratio <= QUARTER_TARGET else "MISS"}')
    except KeyError:
      lines.append(f'K={K} M={m_hi} never: not measured (need gpipe)')
    try:
      lo, hi = Worst('1f1b', m_lo, split), Worst('1f1b', m_hi, split)
      ratio = hi / lo
      lines.append(
          f'{what} never: worst device M={m_hi} {hi:.1f} MiB, M={m_lo} '
          f'{lo:.1f} MiB: {ratio:.2f}x (target at most {FLAT_TARGET:g}x): '
          f'{"ok" if ratio <= FLAT_TARGET else "MISS"}')
    except KeyError:
      lines.append(f'{what} never: not measured (need M={m_lo} and {m_hi})')
  if not lines:
    lines.append(f'K={K} M={m_hi} never: not measured (need 1f1b at M={m_hi})')
  return lines + _NewerLines(results)


def _NewerLines(results: Dict[Config, dict]) -> List[str]:
  """ZB-V against 1F1B, whole and split (target); looped BFS beside
  GPipe in each mode measured (no target); at K=2, M=32."""
  def Worst(config: Config) -> Optional[float]:
    return _Worst(results[config])[1] if config in results else None

  m, lines = 32, []
  zbv = Worst(Config('zb_v', 2, 'never', m))
  for split in (False, True):
    one = Worst(Config('1f1b', 1, 'never', m, split))
    if zbv is None or one is None:
      continue
    ratio = zbv / one
    lines.append(
        f'K={K} M={m} never: ZB-V worst device {zbv:.1f} MiB, 1F1B'
        f'{", backwards split," * split} {one:.1f} MiB: {ratio:.2f}x '
        f'(target at most {ZB_V_TARGET:g}x): '
        f'{"ok" if ratio <= ZB_V_TARGET else "MISS"}')
  for mode in ('never', 'always'):
    looped = Worst(Config('looped_bfs', 2, mode, m))
    gpipe = Worst(Config('gpipe', 1, mode, m))
    if looped is not None and gpipe is not None:
      lines.append(f'K={K} M={m} {mode}: looped BFS V=2 worst device '
                   f'{looped:.1f} MiB, GPipe {gpipe:.1f} MiB: '
                   f'{looped / gpipe:.2f}x (no target)')
  return lines


def Configs(args: argparse.Namespace) -> List[Config]:
  """Every configuration the flags ask for that the schedules' rules
  allow; a schedule that splits its backwards by definition runs once."""
  ms = [int(m) for m in args.ms.split(',')]
  wanted = args.schedules.split(',') if args.schedules else None
  splits = {'both': (False, True), 'whole': (False,), 'split': (True,)}
  configs = []
  for mode in args.modes.split(','):
    for split in splits[args.split] if mode == 'never' else (False,):
      for s, v in SCHEDULES:
        if wanted is not None and s not in wanted:
          continue
        if registry.Lookup(s).splits_backward and split:
          continue
        configs += [Config(s, v, mode, m, split) for m in ms
                    if _Allowed(s, v, mode, m, split)]
  return configs


def _Allowed(schedule: str, v: int, mode: str, m: int, split: bool) -> bool:
  try:
    registry.Check(schedule, K * v, m, v, mode, split)
  except ValueError:
    return False
  return True


def _Args(argv: Sequence[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(prog=cli.Prog(),
                                   description=__doc__.split('\n')[0])
  parser.add_argument('--ms', default='8,32', help='micro-batch counts M')
  parser.add_argument('--modes', default='never,always',
                      help='recompute modes')
  parser.add_argument('--split', default='both',
                      choices=['both', 'whole', 'split'],
                      help="with recompute 'never': whole backwards, split "
                      '(PipeliningLayer.split_backward) or both')
  parser.add_argument('--schedules', default='',
                      help='comma-separated schedules to probe (default '
                      f'all: {",".join(s for s, _ in SCHEDULES)})')
  parser.add_argument('--micro_batch', type=int, default=4,
                      help='sequences per micro-batch')
  parser.add_argument('--repeats', type=int, default=1,
                      help='probes per configuration; the median counts')
  parser.add_argument('--timeout', type=float, default=1800,
                      help='seconds per probe')
  parser.add_argument('--json_out', default='')
  parser.add_argument('--probe', action='store_true', help=argparse.SUPPRESS)
  parser.add_argument('--setup', help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.repeats < 1 or args.micro_batch < 1:
    parser.error('--repeats and --micro_batch must be at least 1.')
  unknown = set(filter(None, args.schedules.split(','))) - {
      s for s, _ in SCHEDULES}
  if unknown:
    parser.error(f'--schedules: {sorted(unknown)} not measured here; name '
                 f'some of {",".join(s for s, _ in SCHEDULES)}.')
  return args


def main(argv: Sequence[str]) -> None:
  args = _Args(argv)
  if args.probe:
    _ProbeMain(args)
  configs = Configs(args)
  print(f'{cli.Header()}\n'
        f'Model: {STACK["num_layers"]} TransformerEncoderLayers, d='
        f'{STACK["model_dim"]}, ff={STACK["hidden_dim"]}, '
        f'{STACK["num_heads"]} heads, seq {STACK["seq_len"]}, float32; '
        f'K={K}, micro-batches of {args.micro_batch} sequences; Adam.',
        flush=True)
  results: Dict[Config, dict] = {}
  for config in configs:
    begin = time.perf_counter()
    rec = results[config] = Measure(config, args)
    print(f'  {config.name} {config.recompute} M={config.m}: activation '
          'MiB ' + ', '.join(f'{a:.1f}' for a in rec['activation_mib']) +
          f' ({time.perf_counter() - begin:.0f} s)', flush=True)
  print('\n' + Table(results, args.micro_batch) + '\n', flush=True)
  for line in Targets(results):
    print(line, flush=True)
  if args.json_out:
    with open(args.json_out, 'w') as f:
      json.dump({'args': vars(args),
                 'results': [dict(dataclasses.asdict(c), **r)
                             for c, r in results.items()]}, f)


if __name__ == '__main__':
  main(sys.argv[1:])
