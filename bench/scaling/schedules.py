"""Schedules side by side: throughput on two pinned workers, and start-up.

  .venv/bin/python -m bench.scaling.run schedules
      [--what=all|throughput|startup] [--rounds=10] [--modes=never,always]
      [--json_out=FILE]
  .venv/bin/python -m bench.scaling.run schedules --what=pictures
      [--pictures=docs/schedules]

Flags: --cost_traces (traced steps the searched table's costs come from,
5), --startup_repeats (3), --warmup (2), --timeout (s per child).

throughput: two `tf.distribute.Server` workers on 127.0.0.1, worker i
pinned to core i, fresh for each recompute mode; one client
(`throughput.py`) builds bench/common's stack (8 Transformer layers, d=256)
in every configuration below, warms each up, then times --rounds rounds
of one training step of each, interleaved: the trainer's step (one pass,
`FPropWithLoss`; an SGD update of each variable on its worker; only the
loss comes back, `stack.TrainStepFunction`). Configurations: K=1 M=1 (the
baseline); K=2 M=8 with GPipe and 1F1B (and zero bubble, ZB-H1, with
recompute 'never', the only mode it runs); K=2 M=4 with GPipe, 1F1B and
interleaved 1F1B (V=2: four stages of two layers, stage s on worker
s mod 2); K=2 M=32 with GPipe and 1F1B; with recompute 'never', GPipe,
1F1B and interleaved 1F1B also with split_backward (each B, the input
gradient, then its W). And at K=2 M=8, the schedules added after ZB-H1
(`_NewerSetups`): ZB-V (V=2: four stages of two layers, stages 0 and 3
on worker 0), interleaved zero bubble (V=2) beside interleaved 1F1B
split (V=2), looped BFS (V=2; with 'always' too, the only one of them
that runs without split backwards), 'auto' (searched with unit costs)
and 'auto (measured costs)'. Before the 'never' client, one more client
on fresh workers (`CostsClient`) builds each of COSTED (1F1B split and
whole, ZB-V, interleaved 1F1B split, interleaved zero bubble; K=2 M=8),
traces --cost_traces steps of each after warm-up and takes, per stage,
the median over the steps of each step's mean F, B and W seconds
(`StepTrace.MeanSeconds`), and per boundary the measured hand-off
(`Hops`). `schedule_search.Search` makes a table from 1F1B split's
costs on every placement of one or two stages a worker
(`plan_search.Placements`: looped, and ZB-V's V; two-layer stages at
half their 1F1B stage's costs, `ScaledCosts`, the hand-off where a
boundary crosses workers), keeps the one that simulates shortest,
`schedule_file.Dump` writes it to a temporary .csv, and that path (with
its V) is the PipeliningLayer's schedule of 'auto (measured costs)'.
Reported: median seconds per step, throughput = t(K=1 M=1) / t, and the
ideal of each schedule, the throughput its table reaches when every
stage's forward costs the same and a backward twice that, hand-offs free
(`schedule.Simulate`): K*M/(M+K-1) for GPipe and 1F1B, more for
interleaved (ZB-H1's ideal takes its B and W as one backward each: 2/3
and 1/3 of it; so does a split table). Each configuration's bubble is
measured too (step_trace, one traced step) beside the ideal bubble of
its order.

startup: K=8 M=32, K logical CPUs in one process per measurement
(`startup.py`), --startup_repeats measurements, medians: the start-up
stack (8 layers d=64) in every schedule, one stage per device (GPipe,
1F1B, ZB-H1, 'auto') or, for the tables of two stages a device (V=2: 16
stages: interleaved 1F1B, ZB-V, interleaved zero bubble, looped BFS),
each layer as its two residual sub-layers (`Stack.halves`, the same
function), where 1F1B runs too (eight stages of two sub-layers) as the
reference on that model; and a 16-layer stack, twice the model, in GPipe
and interleaved 1F1B.

pictures: the measured timeline (step_trace) of one training step of each
schedule on the two pinned workers (the trainer's step, as throughput's),
K=2 M=8 recompute 'never' (V=2 for interleaved 1F1B, ZB-V, interleaved
zero bubble and looped BFS; 'auto' with unit costs), written as
<schedule>.svg and .json into --pictures.

Targets (docs/DESIGN.md sections 2 and 29): 1F1B K=2 M=8 reaches at least
0.9 of GPipe's ideal; interleaved K=2 V=2 M=4 beats GPipe K=2 M=4 by at
least half of what the two ideals predict; K=8 M=32 first step at most
10 s for every schedule on the 8-layer model. The throughput targets are
judged with backwards whole and, with recompute 'never', split (each
against GPipe split the same way).

Targets of the schedules added after ZB-H1 (recompute 'never', K=2 M=8):
- ZB-V against 1F1B, whole and split (two lines), and interleaved zero
  bubble against interleaved 1F1B split (V=2): the measured gain
  t(old) / t(new) - 1 at least half of the predicted one,
  sim(old) / sim(new) - 1, where sim is the step `schedule.Simulate`
  gives the configuration's table, hand-offs free (as in the ideal),
  with costs CostsClient traced (not the one step traced for the
  bubble: one step's means moved by up to 30% from the median of
  several). 1F1B, whole or split, takes its own traced F, B (and W) per
  stage; a table of two-layer stages (V=2) takes 1F1B split's, each
  stage's layers at their share of the 1F1B stage holding them (half of
  it: `ScaledCosts`). Not its own traced costs: traced, the four stages'
  tasks added up to 4-14% more per micro-batch than 1F1B split's two (two
  runs), while in the timed steps their workers' CPU per step was 0-5%
  above 1F1B split's; much of that extra is the trace's, twice the tasks
  stamped, and it would make the tables of small stages look slower than
  they run. Each line gives the prediction from their own costs too.
- auto (measured costs): its median step at most 1.02x the fastest
  named (not searched) schedule's and at most 1.02x 1F1B's (whole).
- Start-up, K=8 M=32: each of ZB-V, interleaved zero bubble, looped BFS
  and 'auto' within 1.3x of 1F1B's median first step on the same model
  in the same run (ZB-V, interleaved zero bubble and looped BFS on the
  8 layers as 16 sub-layers, against 1F1B there; 'auto' on the 8 layers).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from lingvo_pipe.core import quiet  # noqa: E402

quiet.ImportTensorFlow()  # before the modules below import it

from bench.common import cli  # noqa: E402
from bench.common import stack as stack_lib  # noqa: E402
from bench.scaling import pipeline as scaling  # noqa: E402
from lingvo_pipe.core import local_workers  # noqa: E402
from lingvo_pipe.core import schedule  # noqa: E402
from lingvo_pipe.core import schedule_file  # noqa: E402
from lingvo_pipe.core import step_trace  # noqa: E402
from lingvo_pipe.core.schedules import registry  # noqa: E402
from lingvo_pipe.tools import plan_search  # noqa: E402

Setup = stack_lib.Setup
ONE_F_ONE_B_TARGET = 0.9  # of GPipe's ideal, K=2 M=8
INTERLEAVED_SHARE_TARGET = 0.5  # of the predicted gain over GPipe, M=4
ZERO_BUBBLE_SHARE_TARGET = 0.5  # of the gain the traced costs predict
AUTO_SLACK = 1.02  # auto (measured costs) / the best named, / 1F1B
FIRST_STEP_TARGET = 10.0  # seconds, K=8 M=32
FIRST_STEP_RATIO_TARGET = 1.3  # a newer schedule's / 1F1B's, K=8 M=32
# The schedules added after ZB-H1, held to FIRST_STEP_RATIO_TARGET.
NEWER = ('zb_v', 'interleaved_zb', 'looped_bfs', 'auto')
# Traced by CostsClient: the first's costs are searched from, every one's
# predict its step for the zero-bubble targets.
COSTED = tuple(Setup('pipe', 2, 8, 'never', s, v, split) for s, v, split in (
    ('1f1b', 1, True), ('1f1b', 1, False), ('zb_v', 2, False),
    ('interleaved_1f1b', 2, True), ('interleaved_zb', 2, False)))
COSTS_SETUP = COSTED[0]
SEARCHED = 'auto (measured costs)'  # that table's name in the tables


def Runs(setup: Setup) -> bool:
  """Whether the rules of setup's schedule allow it (registry.Check)."""
  try:
    registry.Check(setup.schedule, setup.k * setup.v, setup.m, setup.v,
                   setup.recompute, setup.split)
  except ValueError:
    return False
  return True


def ThroughputSetups(mode: str, searched: str = '', searched_v: int = 1
                     ) -> List[Setup]:
  """Every throughput configuration of `mode` (module docstring);
  `searched` is the .csv table of 'auto (measured costs)', if any, of
  `searched_v` stages a device."""
  never = mode == 'never'
  zero_bubble = ['zb_h1'] if never else []
  splits = (False, True) if never else (False,)
  return ([Setup('pipe', 1, 1, mode)] +
          [Setup('pipe', 2, 8, mode, s, 1, split)
           for split in splits for s in ('gpipe', '1f1b')] +
          [Setup('pipe', 2, 8, mode, s) for s in zero_bubble] +
          _NewerSetups(mode, searched, searched_v) +
          [Setup('pipe', 2, 4, mode, s) for s in ('gpipe', '1f1b')] +
          [Setup('pipe', 2, 4, mode, s, v, split) for split in splits
           for s, v in (('gpipe', 1), ('interleaved_1f1b', 2))
           if split or s != 'gpipe'] +
          [Setup('pipe', 2, 32, mode, s) for s in ('gpipe', '1f1b')] +
          [Setup('pipe', 2, 32, mode, '1f1b', 1, True)] * never)


def _NewerSetups(mode: str, searched: str, searched_v: int) -> List[Setup]:
  """K=2 M=8: ZB-V, interleaved 1F1B split beside interleaved zero
  bubble, looped BFS (V=2 each), 'auto' and the `searched` table; those
  whose rules allow `mode` (with 'always': looped BFS)."""
  setups = [Setup('pipe', 2, 8, mode, s, v, split) for s, v, split in (
      ('zb_v', 2, False), ('interleaved_1f1b', 2, True),
      ('interleaved_zb', 2, False), ('looped_bfs', 2, False),
      ('auto', 1, False))]
  if searched:
    setups.append(Setup('pipe', 2, 8, mode, searched, searched_v))
  return [s for s in setups if Runs(s)]


Ideal = stack_lib.Ideal


def MeasureThroughput(stack: stack_lib.Stack, modes: Sequence[str],
                      args: argparse.Namespace, directory: str
                      ) -> Tuple[Dict[str, dict], dict]:
  """(label -> throughput.py's record, the searched table's record); the
  searched table is written into `directory`."""
  out, searched = {}, {}
  with tempfile.TemporaryDirectory(prefix='schedules_servers_') as logs:
    workers = local_workers.LocalWorkers(2, logs)
    for mode in modes:
      start = time.time()
      if mode == COSTS_SETUP.recompute:
        searched = SearchMeasured(workers, args, directory)
      results = scaling._OneClient(  # pylint: disable=protected-access
          workers, stack,
          ThroughputSetups(mode, searched.get('path', ''),
                           searched.get('v', 1)), args)
      out.update(results)
      for label, r in results.items():
        if 'error' not in r:
          print(f'  {label}: {statistics.median(r["times"]):.3f} s/step, '
                f'first call {r["first"]:.1f} s', flush=True)
      print(f'  {mode}: {time.time() - start:.0f} s', flush=True)
  return out, searched


# ---- the table searched from measured costs ---------------------------------


def Hops(trace: step_trace.StepTrace) -> List[float]:
  """Per stage boundary, the median hand-off seen in `trace`: over the
  tasks whose last input to arrive came from another device that they
  waited for idle, start minus that input's end (0 if none did)."""
  tasks = sorted((t for t in trace.tasks if t.phase in schedule.PHASES),
                 key=lambda t: t.start)
  made = {t.action: t for t in tasks}
  s_total = 1 + max(t.partition for t in tasks)
  free: Dict[str, float] = {}  # device -> end of its task before
  gaps: List[List[float]] = [[] for _ in range(s_total - 1)]
  for t in tasks:
    deps = [made[d] for d in schedule.Dependencies(t.action, s_total)]
    last = max(deps, key=lambda d: d.end, default=None)
    if (last is not None and last.device != t.device and
        free.get(t.device, 0.0) <= last.end):
      gaps[min(last.partition, t.partition)].append(t.start - last.end)
    free[t.device] = t.end
  return [statistics.median(g) if g else 0.0 for g in gaps]


def CostsClient(spec: str, traces: int, warmup: int) -> None:
  """In a child process (it connects to the workers): each of COSTED's
  steps traced `traces` times after `warmup` steps. Prints as JSON, per
  setup (its ToText), per phase (F, B, W) per stage the median over the
  traces of each one's mean seconds, and per boundary ('hop') the median
  of each one's Hops."""
  from lingvo_pipe.core import cluster  # pylint: disable=g-import-not-at-top
  devices = cluster.Connect(cluster.ParseClusterSpec(spec))
  stack = stack_lib.Stack()
  inputs = stack_lib.Inputs(stack)
  out = {}
  for setup in COSTED:
    layer = stack_lib.BuildModel(stack, setup, devices)
    step = stack_lib.TrainStepFunction(layer, setup, devices[0])
    tracer = step_trace.Tracer(step.python_function, inputs)
    for _ in range(warmup):
      tracer.Step()
    runs = [tracer.Run() for _ in range(traces)]
    means = [r.MeanSeconds('model') for r in runs]
    costs = out[setup.ToText()] = {
        p: [statistics.median(x) for x in zip(*(m[p] for m in means))]
        for p in schedule.PHASES}
    costs['hop'] = [statistics.median(x) for x in zip(*map(Hops, runs))]
  print(json.dumps(out), flush=True)


def SearchMeasured(workers: local_workers.LocalWorkers,
                   args: argparse.Namespace, directory: str) -> dict:
  """COSTED's costs measured on fresh workers (CostsClient), the table
  schedule_search.Search makes of COSTS_SETUP's written to a .csv file in
  `directory`; its record (path, every setup's costs, the table, steps
  simulated with them), or {'error'} if the costs could not be
  measured."""
  workers.Start()
  try:
    measured = scaling._RunChild(  # pylint: disable=protected-access
        'schedules', [f'--cluster_spec={workers.spec}',
                      f'--cost_traces={args.cost_traces}',
                      f'--warmup={args.warmup}', '--costs_client'],
        args.timeout)
  except scaling.ChildFailed as e:
    print(f'  costs of {COSTS_SETUP.label}: {e}', flush=True)
    return {'error': str(e)}
  finally:
    workers.Stop()
  s, costs = COSTS_SETUP, measured[COSTS_SETUP.ToText()]
  # V -> (simulated step, table, hops) of the best placement of V stages
  # a worker, each stage its share of the 1F1B stage holding its layers.
  tried = {}
  for v in (1, 2):
    scaled = ScaledCosts(costs, s.k * v)
    tried[v] = plan_search.SearchPlacements(
        SEARCHED, s.m, scaled['F'], scaled['B'], scaled['W'],
        plan_search.Placements(s.k, v),
        lambda devs: _Hops(devs, costs['hop'][0]))
  v = min(tried, key=lambda x: tried[x][0])
  table = tried[v][1]
  path = os.path.join(directory, 'auto_measured.csv')
  schedule_file.Dump(table, path)
  simulated = {name: _Step(t, ScaledCosts(costs, t.num_stages),
                           _Hops(t.stage_devices, costs['hop'][0]))
               for name, t in (
      ('1f1b, split', registry.Make('1f1b', s.k, s.m, 1, True)),
      ('zb_h1', registry.Make('zb_h1', s.k, s.m)),
      ('zb_v', registry.Make('zb_v', s.k, s.m, 2)),
      ('auto', registry.Make('auto', s.k, s.m)))}
  simulated.update({f'{SEARCHED}, V={x}': tried[x][0] for x in tried})
  with open(path) as f:
    csv_text = f.read()
  record = {'path': path, 'v': v, 'costs': measured, 'simulated': simulated,
            'timeline': schedule.Timeline(table), 'csv': csv_text}
  print('\n'.join(SearchedLines(record)), flush=True)
  return record


def _Hops(stage_devices: Sequence[int], hop: float) -> List[float]:
  """Per stage boundary: `hop` where it crosses devices, else 0."""
  return [hop if a != b else 0.0
          for a, b in zip(stage_devices, stage_devices[1:])]


def _Step(table: schedule.Schedule, costs: dict, hops: List[float]) -> float:
  """table's step simulated with per-stage `costs` and `hops`."""
  return schedule.Simulate(table, costs['F'], costs['B'], hop_s=hops,
                           weight_s=costs['W']).step


def SearchedLines(record: dict) -> List[str]:
  """What the searched table was made of, and its order."""
  if 'costs' not in record:
    return []
  ms = {p: ', '.join(f'{x * 1e3:.1f}' for x in v)
        for p, v in record['costs'][COSTS_SETUP.ToText()].items()}
  sims = '; '.join(f'{name} {t * 1e3:.0f} ms'
                   for name, t in record['simulated'].items())
  return [f'{SEARCHED}: schedule_search.Search from the costs of '
          f"{COSTS_SETUP.label}'s traced steps, ms per stage: F {ms['F']}; "
          f"B {ms['B']}; W {ms['W']}; hand-off {ms['hop']}. Steps "
          f'simulated with these costs: {sims}. Its order:', '',
          '```', record['timeline'], '```']


def ThroughputTable(stack: stack_lib.Stack, mode: str,
                    results: Dict[str, dict], searched: dict) -> str:
  rows = [(Setup.FromText(r['setup']), r) for r in results.values()
          if Setup.FromText(r['setup']).recompute == mode]
  med = {s: statistics.median(r['times']) for s, r in rows
         if 'error' not in r}
  base = next((t for s, t in med.items() if s.k == 1), None)
  lines = [f"### Schedules, recompute '{mode}'", '',
           f'{stack.Describe()}; one worker process per task, each pinned '
           'to one core.', '',
           '| schedule | K | V | M | median s/step | throughput | ideal '
           '| of its ideal | of GPipe\'s ideal | bubble (ideal) '
           '| worker CPU s/step |',
           '|' + '---|' * 11]
  for s, r in rows:
    if 'error' in r:
      lines.append(f'| {_Name(s)} | {s.k} | {s.v} | {s.m} | error: '
                   f'{r["error"].strip().splitlines()[-1][:80]} |')
      continue
    tput = base / med[s]
    gpipe_ideal = Ideal(dataclasses.replace(s, schedule='gpipe', v=1,
                                            split=False))
    lines.append(
        f'| {_Name(s)} | {s.k} | {s.v} | {s.m} | {med[s]:.3f} | '
        f'{tput:.2f} | {Ideal(s):.2f} | {tput / Ideal(s):.2f} | '
        f'{tput / gpipe_ideal:.2f} | {_Bubble(r)} | '
        f'{", ".join(f"{c:.3f}" for c in r["worker_cpu"])} |')
  lines += [''] + Targets(med, base, searched.get('costs', {}))
  if mode == COSTS_SETUP.recompute:
    lines += [''] + SearchedLines(searched)
  return '\n'.join(lines)


def _Schedule(setup: Setup) -> str:
  """The schedule's name; SEARCHED for the table searched from measured
  costs (a .csv path)."""
  return SEARCHED if setup.schedule.endswith('.csv') else setup.schedule


def _Name(setup: Setup) -> str:
  return _Schedule(setup) + (', split' if setup.split else '')


def _Bubble(record: dict) -> str:
  if 'bubble' not in record:
    return '-'
  return f'{record["bubble"]:.0%} ({record["ideal_bubble"]:.0%})'


def Targets(med: Dict[Setup, float], base: float,
            costs: Dict[str, dict]) -> List[str]:
  """The module docstring's throughput targets, met or missed: with
  backwards whole and, where measured, split; `costs`, CostsClient's."""
  def Find(m: int, sched: str, split: bool = False) -> Optional[Setup]:
    return next((s for s in med if s.k == 2 and s.m == m and
                 _Schedule(s) == sched and s.split == split), None)

  lines = []
  for split in (False, True):
    one = Find(8, '1f1b', split)
    if one is not None:
      ratio = base / med[one] / Ideal(Setup('pipe', 2, 8, one.recompute))
      lines.append(f'- 1F1B K=2 M=8{", split" * split}: {ratio:.2f} of '
                   f"GPipe's ideal (target >= {ONE_F_ONE_B_TARGET}: "
                   f'{"ok" if ratio >= ONE_F_ONE_B_TARGET else "MISS"})')
  for split in (False, True):
    inter, gpipe = Find(4, 'interleaved_1f1b', split), Find(4, 'gpipe', split)
    if inter is not None and gpipe is not None:
      predicted = Ideal(inter) / Ideal(gpipe) - 1.0
      measured = med[gpipe] / med[inter] - 1.0
      share = measured / predicted
      lines.append(
          f'- interleaved K=2 V=2 M=4 against GPipe K=2 M=4'
          f'{", both split" * split}: {measured:+.1%} (ideal '
          f'{predicted:+.1%}; {share:.2f} of it, target >= '
          f'{INTERLEAVED_SHARE_TARGET}: '
          f'{"ok" if share >= INTERLEAVED_SHARE_TARGET else "MISS"})')
  for split in (False, True):
    lines += _GainLine(f'ZB-V K=2 V=2 M=8 against 1F1B K=2 M=8'
                       f'{", split" * split}', Find(8, 'zb_v'),
                       Find(8, '1f1b', split), med, costs)
  lines += _GainLine('interleaved zero bubble K=2 V=2 M=8 against '
                     'interleaved 1F1B K=2 V=2 M=8, split',
                     Find(8, 'interleaved_zb'),
                     Find(8, 'interleaved_1f1b', True), med, costs)
  return lines + _AutoLines(med, Find(8, SEARCHED), Find(8, '1f1b'))


def ScaledCosts(costs: dict, num_stages: int) -> dict:
  """COSTS_SETUP's per-stage costs spread over `num_stages` equal stages
  of the same layers, in order: each stage costs its share of the
  COSTS_SETUP stage that holds its layers."""
  per = num_stages // len(costs['F'])
  return {p: [costs[p][s // per] / per for s in range(num_stages)]
          for p in schedule.PHASES}


def _SimulatedStep(setup: Setup, costs: Dict[str, dict],
                   own: bool) -> Optional[float]:
  """The step of setup's table simulated with CostsClient's costs
  (hand-offs free): its own (`own`, or one stage a device), else
  COSTS_SETUP's scaled to its stages (module docstring)."""
  key = setup.ToText() if own or setup.v == 1 else COSTS_SETUP.ToText()
  if key not in costs:
    return None
  table = registry.Make(setup.schedule, setup.k, setup.m, setup.v,
                        split_backward=setup.split)
  means = costs[key]
  if key != setup.ToText():
    means = ScaledCosts(means, table.num_stages)
  return schedule.Simulate(table, means['F'], means['B'],
                           weight_s=means['W']).step


def _GainLine(what: str, new: Optional[Setup], old: Optional[Setup],
              med: Dict[Setup, float],
              costs: Dict[str, dict]) -> List[str]:
  """The zero-bubble target (module docstring): `new`'s measured gain
  over `old` against the gain their tables predict with traced costs."""
  if new is None or old is None:
    return []
  measured = med[old] / med[new] - 1.0
  old_s, new_s = (_SimulatedStep(old, costs, False),
                  _SimulatedStep(new, costs, False))
  if old_s is None or new_s is None:
    return [f'- {what}: {measured:+.1%} (no traced costs: no target)']
  predicted = old_s / new_s - 1.0
  share = f', {measured / predicted:.2f} of it' if predicted > 0 else ''
  met = measured >= ZERO_BUBBLE_SHARE_TARGET * predicted
  own = [_SimulatedStep(s, costs, True) for s in (old, new)]
  also = (f'; from their own traced costs {own[0] / own[1] - 1.0:+.1%}'
          if None not in own else '')
  return [f'- {what}: {measured:+.1%} (predicted {predicted:+.1%}, '
          f'{old_s * 1e3:.0f} and {new_s * 1e3:.0f} ms simulated{share}; '
          f'target >= {ZERO_BUBBLE_SHARE_TARGET} of it: '
          f'{"ok" if met else "MISS"}{also})']


def _AutoLines(med: Dict[Setup, float], auto: Optional[Setup],
               one: Optional[Setup]) -> List[str]:
  """The measured-costs table against the fastest named (not searched)
  schedule at K=2 M=8 and against 1F1B (module docstring)."""
  named = [s for s in med if s.k == 2 and s.m == 8 and
           not s.schedule.endswith('.csv') and
           not registry.Lookup(s.schedule).searched]
  if auto is None or one is None or not named:
    return []
  best = min(named, key=med.get)
  r_best, r_one = med[auto] / med[best], med[auto] / med[one]
  return [f'- {SEARCHED} K=2 M=8: {med[auto]:.3f} s/step, {r_best:.3f}x '
          f'the fastest named schedule ({_Name(best)} V={best.v}, '
          f'{med[best]:.3f} s; target <= {AUTO_SLACK}x: '
          f'{"ok" if r_best <= AUTO_SLACK else "MISS"}) and {r_one:.3f}x '
          f'1F1B ({med[one]:.3f} s; target <= {AUTO_SLACK}x: '
          f'{"ok" if r_one <= AUTO_SLACK else "MISS"})']


# The start-up models: key -> (encoder layers, as halves, table label).
STARTUP_MODELS = {'8': (8, False, '8 layers'),
                  '8h': (8, True, '8 layers as 16 halves'),
                  '16': (16, False, '16 layers')}


def StartupRuns(modes: Sequence[str]) -> List[Tuple[str, Setup]]:
  """(model key, setup): the 8-layer stack for every schedule (as its 16
  sub-layers where a table needs K x V = 16 stages, 1F1B there too); a
  16-layer stack, twice the model, for GPipe and interleaving beside it.
  The schedules after ZB-H1 where their rules allow the mode."""
  runs = []
  for mode in modes:
    runs += [('8', Setup('pipe', 8, 32, mode, s)) for s in ('gpipe', '1f1b')]
    if mode == 'never':
      runs.append(('8', Setup('pipe', 8, 32, mode, 'zb_h1')))
    runs.append(('8h', Setup('pipe', 8, 32, mode, 'interleaved_1f1b', 2)))
    runs += [(model, s) for model, s in (
        ('8', Setup('pipe', 8, 32, mode, 'auto')),
        ('8h', Setup('pipe', 8, 32, mode, '1f1b')),
        ('8h', Setup('pipe', 8, 32, mode, 'zb_v', 2)),
        ('8h', Setup('pipe', 8, 32, mode, 'interleaved_zb', 2)),
        ('8h', Setup('pipe', 8, 32, mode, 'looped_bfs', 2))) if Runs(s)]
    runs += [('16', Setup('pipe', 8, 32, mode, 'gpipe')),
             ('16', Setup('pipe', 8, 32, mode, 'interleaved_1f1b', 2))]
  return runs


def MeasureStartup(args: argparse.Namespace) -> Dict[str, dict]:
  runs = StartupRuns(args.modes.split(','))
  times: Dict[int, List[float]] = {i: [] for i in range(len(runs))}
  for i in stack_lib.Rotations(list(range(len(runs))), args.startup_repeats):
    model, setup = runs[i]
    layers, halves, label = STARTUP_MODELS[model]
    stack = stack_lib.Stack(num_layers=layers, model_dim=64, hidden_dim=256,
                            halves=halves)
    r = scaling._RunChild(  # pylint: disable=protected-access
        'startup', [f'--stack={json.dumps(dataclasses.asdict(stack))}',
                       '--steps=1', f'--setup={setup.ToText()}'],
        args.timeout)
    times[i].append(r['first_step'])
    print(f'  {label}, {setup.label}: first step '
          f'{r["first_step"]:.1f} s, {r["ops"]} ops', flush=True)
  return {f'{model}:{setup.ToText()}': {'first_step_runs': times[i]}
          for i, (model, setup) in enumerate(runs)}


def StartupTable(results: Dict[str, dict]) -> str:
  """The first step of every run; the target holds the 8-layer model's
  slowest median (every schedule on the same model)."""
  lines = ['### Start-up, K=8 M=32', '',
           'Transformer layers d=64, ff=256; K logical CPUs in one '
           'process per measurement.', '',
           '| model | schedule | V | recompute | first step s (median) '
           '| each run |', '|---|---|---|---|---|---|']
  worst, meds = {}, {}
  for key, r in results.items():
    model, text = key.split(':')
    s = Setup.FromText(text)
    med = meds[(model, s)] = statistics.median(r['first_step_runs'])
    layers = STARTUP_MODELS[model][0]
    worst[layers] = max(worst.get(layers, 0.0), med)
    lines.append(f'| {STARTUP_MODELS[model][2]} | {s.schedule} | {s.v} | '
                 f'{s.recompute} | {med:.1f} | ' +
                 ', '.join(f'{t:.1f}' for t in r['first_step_runs']) + ' |')
  lines.append('')
  if 8 in worst:
    lines.append(f'- 8 layers, every schedule: slowest median {worst[8]:.1f} '
                 f's (target <= {FIRST_STEP_TARGET:.0f} s: '
                 f'{"ok" if worst[8] <= FIRST_STEP_TARGET else "MISS"})')
  if 16 in worst:
    lines.append(f'- 16 layers (twice the model, no target): slowest median '
                 f'{worst[16]:.1f} s')
  return '\n'.join(lines + _StartupRatios(meds))


def _StartupRatios(meds: Dict[Tuple[str, Setup], float]) -> List[str]:
  """Each newer schedule's median first step against 1F1B's on the same
  model and mode (module docstring)."""
  lines = []
  for (model, s), med in meds.items():
    if s.schedule not in NEWER:
      continue
    one = meds.get((model, Setup('pipe', s.k, s.m, s.recompute, '1f1b')))
    where = f'{s.schedule} V={s.v}, {STARTUP_MODELS[model][2]}, {s.recompute}'
    if one is None:
      lines.append(f'- {where}: {med:.1f} s (no 1F1B on this model)')
      continue
    ratio = med / one
    lines.append(f'- {where}: {med:.1f} s, {ratio:.2f}x 1F1B on the same '
                 f'model ({one:.1f} s; target <= {FIRST_STEP_RATIO_TARGET}x: '
                 f'{"ok" if ratio <= FIRST_STEP_RATIO_TARGET else "MISS"})')
  return lines


PICTURES = [Setup('pipe', 2, 8, 'never', s, v) for s, v in (
    ('gpipe', 1), ('1f1b', 1), ('1f1b_ahead', 1), ('interleaved_1f1b', 2),
    ('zb_h1', 1), ('zb_v', 2), ('interleaved_zb', 2), ('looped_bfs', 2),
    ('auto', 1))]


def PicturesClient(spec: str, directory: str) -> None:
  """In a child process (it connects to the workers): one measured step
  of each of PICTURES, written into `directory`."""
  from lingvo_pipe.core import cluster  # pylint: disable=g-import-not-at-top
  devices = cluster.Connect(cluster.ParseClusterSpec(spec))
  stack = stack_lib.Stack()
  inputs = stack_lib.Inputs(stack)
  for setup in PICTURES:
    layer = stack_lib.BuildModel(stack, setup, devices)
    step = stack_lib.TrainStepFunction(layer, setup, devices[0])
    trace = step_trace.Measure(step.python_function, inputs, warmup=3)
    trace.Write(os.path.join(directory, setup.schedule))
    print(trace.Summary().splitlines()[0], flush=True)


def Pictures(args: argparse.Namespace) -> None:
  os.makedirs(args.pictures, exist_ok=True)
  with tempfile.TemporaryDirectory(prefix='schedules_servers_') as logs:
    with local_workers.LocalWorkers(2, logs) as workers:
      out = subprocess.run(
          [sys.executable, '-m', 'bench.scaling.schedules',
           '--pictures_client',
           f'--cluster_spec={workers.spec}', f'--pictures={args.pictures}'],
          capture_output=True, text=True, timeout=args.timeout)
  if out.returncode:
    raise SystemExit(f'pictures failed:\n{out.stderr[-3000:]}')
  print(out.stdout, end='')


def _Args(argv: Sequence[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(prog=cli.Prog(),
                                   description=__doc__.split('\n')[0])
  parser.add_argument('--what', default='all',
                      choices=('all', 'throughput', 'startup', 'pictures'))
  parser.add_argument('--pictures', default='docs/schedules',
                      help='Directory of the measured timelines.')
  parser.add_argument('--pictures_client', action='store_true',
                      help=argparse.SUPPRESS)
  parser.add_argument('--cluster_spec', default='', help=argparse.SUPPRESS)
  parser.add_argument('--costs_client', action='store_true',
                      help=argparse.SUPPRESS)
  parser.add_argument('--cost_traces', type=int, default=5,
                      help="Traced steps of 1F1B split K=2 M=8 whose costs "
                      "the 'auto (measured costs)' table is searched from.")
  parser.add_argument('--rounds', type=int, default=10)
  parser.add_argument('--warmup', type=int, default=2)
  parser.add_argument('--modes', default='never,always')
  parser.add_argument('--startup_repeats', type=int, default=3)
  parser.add_argument('--timeout', type=float, default=1800)
  parser.add_argument('--json_out', default=None)
  return parser.parse_args(argv)


def main(argv: Sequence[str]) -> None:
  scaling.Stoppable(_Main, argv)


def _Main(argv: Sequence[str]) -> None:
  args = _Args(argv)
  if args.pictures_client:
    PicturesClient(args.cluster_spec, args.pictures)
    return
  if args.costs_client:
    CostsClient(args.cluster_spec, args.cost_traces, args.warmup)
    return
  if args.what == 'pictures':
    Pictures(args)
    return
  args.bubbles = True  # throughput.py measures each bubble too
  header = scaling._Header()  # pylint: disable=protected-access
  print(header, flush=True)
  stack = stack_lib.Stack()
  raw, tables = {'header': header}, []
  if args.what in ('all', 'throughput'):
    with tempfile.TemporaryDirectory(prefix='schedules_searched_') as where:
      raw['throughput'], raw['searched'] = MeasureThroughput(
          stack, args.modes.split(','), args, where)
      tables += [ThroughputTable(stack, mode, raw['throughput'],
                                 raw['searched'])
                 for mode in args.modes.split(',')]
  if args.what in ('all', 'startup'):
    raw['startup'] = MeasureStartup(args)
    tables.append(StartupTable(raw['startup']))
  if args.json_out:
    with open(args.json_out, 'w') as f:
      json.dump(raw, f, indent=1)
  print('\n\n'.join([header] + tables))


if __name__ == '__main__':
  main(sys.argv[1:])
