"""The pipeline as it really ran: one step's measured timeline.

`Measure(fn, *args)` traces `fn` (a step that runs PipeliningLayers and
their gradients) with every pipeline task stamped by the runtime
(`stamps.RecordTasks`: tf.timestamp on the task's device, so on the
worker process that ran it), runs it `warmup` times, then once more, and
returns that run as a `StepTrace`: each task (an action of the schedule's
table: forward; backward, split at the end of its re-computation) with
its measured start and end. Times are seconds from the step's first task
start, on the trainer's clock.

The table that ran is read back from the trace (`StepTrace.Table`): the
engine records each device's actions in the order it emits them, which
is the table's order, and each stage's device from where its tasks ran.
Its ideal bubble is `schedule.Simulate` of that table with each stage's
measured mean forward and backward: the idle share this order would have
with no hand-off and no overhead, whatever the schedule.

Clocks: devices of this process share its clock. A worker task's stamps
come from that process's clock (on another host, another machine's);
`ClockOffsets` measures each task's offset from the trainer's clock by a
round trip (the stamp against the middle of the call, the fastest of
several calls; uncertainty half that round trip) and the trace is shifted
by it when it exceeds its uncertainty. On one host (one clock) it does
not, and the summary says so.

`StepTrace.ChromeTrace()` is Chrome's trace event format (open in
https://ui.perfetto.dev or chrome://tracing); `Svg()` draws one row per
device in the manner of the paper's Figure 2 (several stages share a row
with interleaving), with the measured bubble beside the ideal for the
order that ran and each device's busy fraction.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import statistics
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple
from xml.sax import saxutils

import tensorflow as tf

from lingvo_pipe.core import schedule
from lingvo_pipe.core.schedules import registry
from lingvo_pipe.core import stamps
from lingvo_pipe.core import timeline


@dataclasses.dataclass(frozen=True)
class MeasuredTask:
  """One task as it ran; times in seconds from the step's first start."""
  layer: str
  device: str
  phase: str  # 'F', 'B' or 'W'
  partition: int  # the stage
  micro_batch: int
  start: float
  end: float
  recomputed: Optional[float] = None  # 'B' with re-computation: its end

  @property
  def name(self) -> str:
    return f'{self.phase}{self.micro_batch}'

  @property
  def action(self) -> schedule.Action:
    return schedule.Action(self.phase, self.partition, self.micro_batch)


@dataclasses.dataclass
class StepTrace:
  """The measured tasks of one step, and how each clock was aligned.

  `tasks` are in the order the step was traced: per layer and replica, in
  schedule order.
  """
  tasks: List[MeasuredTask]
  clocks: Dict[str, str]

  def Layers(self) -> List[str]:
    return sorted({t.layer for t in self.tasks})

  def _Mine(self, layer: str) -> List[MeasuredTask]:
    mine = [t for t in self.tasks if t.layer == layer]
    if not mine:
      raise ValueError(f'The trace has no tasks of layer {layer!r}; its '
                       f'layers are {self.Layers()}.')
    return mine

  def Shape(self, layer: str) -> Tuple[int, int]:
    """(K, M) of `layer` in this step: devices per replica, micro-batches."""
    return (len(self.ReplicaDevices(layer)[0]),
            max(t.micro_batch for t in self._Mine(layer)) + 1)

  def ReplicaDevices(self, layer: str) -> List[List[str]]:
    """Per replica, its K devices; device d is the one of stage d.

    Replicas are told apart by the order the step traced them in: the
    r-th device seen running stage s is replica r's.
    """
    per_stage: Dict[int, List[str]] = {}
    for t in self._Mine(layer):  # in the order the step traced them
      seen = per_stage.setdefault(t.partition, [])
      if t.device not in seen:
        seen.append(t.device)
    replicas = []
    for r in range(len(per_stage[min(per_stage)])):
      devs: List[str] = []
      for s in sorted(per_stage):
        if r < len(per_stage[s]) and per_stage[s][r] not in devs:
          devs.append(per_stage[s][r])
      replicas.append(devs)
    return replicas

  def Devices(self, layer: str) -> List[str]:
    """Replica r's device d at index r * K + d."""
    return [d for devs in self.ReplicaDevices(layer) for d in devs]

  def Table(self, layer: str) -> schedule.Schedule:
    """The table replica 0 ran, from its recorded actions (module
    docstring); named after the generator that makes the same table, else
    'as recorded'."""
    mine = self._Mine(layer)
    devs = self.ReplicaDevices(layer)[0]
    stage_devices: Dict[int, int] = {}
    order: List[List[schedule.Action]] = [[] for _ in devs]
    for t in mine:
      if t.device in devs and t.phase != schedule.ALL_REDUCE:
        d = devs.index(t.device)
        stage_devices.setdefault(t.partition, d)
        order[d].append(t.action)
    table = schedule.Schedule(
        'as recorded', max(t.micro_batch for t in mine) + 1,
        tuple(stage_devices[s] for s in range(len(stage_devices))),
        tuple(tuple(row) for row in order))
    return _Named(table)

  def MeanSeconds(self, layer: str) -> Dict[str, List[float]]:
    """Per phase (F, B with its re-computation, W), per stage: the mean
    measured seconds over micro-batches and replicas; 0 where none ran."""
    mine = self._Mine(layer)
    num_stages = max(t.partition for t in mine) + 1
    means = {}
    for phase in schedule.PHASES:
      per_stage: List[List[float]] = [[] for _ in range(num_stages)]
      for t in mine:
        if t.phase == phase:
          per_stage[t.partition].append(t.end - t.start)
      means[phase] = [statistics.mean(x) if x else 0.0 for x in per_stage]
    return means

  def Span(self, layer: str) -> Tuple[float, float]:
    mine = self._Mine(layer)
    return min(t.start for t in mine), max(t.end for t in mine)

  def BusyFractions(self, layer: str) -> List[float]:
    """Per device (as Devices): time in its tasks / the layer's span
    (an all-reduce is not the device's work: it runs beside it)."""
    begin, end = self.Span(layer)
    busy = {d: 0.0 for d in self.Devices(layer)}
    for t in self._Mine(layer):
      if t.phase != schedule.ALL_REDUCE:
        busy[t.device] += t.end - t.start
    return [b / max(end - begin, 1e-12) for b in busy.values()]

  def ExposedAllReduce(self, layer: str) -> List[float]:
    """Per device (as Devices): seconds its last all-reduce ran past both
    its own last backward (or W) and the moment every replica's part of
    that sum was ready (the stage's last backward on any replica): the
    exchange no backward hid. Waiting for a slower replica's backward is
    not counted here (ReplicaWait). 0 without replicas, or when the sums
    were in before the backward's end was stamped. With several stages on
    a device, an all-reduce that ends while the device still runs an
    earlier stage's backwards is hidden by them."""
    work, ready, sums = self._AllReduceTimes(layer)
    return [max([0.0] + [end - max(work[d], ready.get(s, 0.0))
                         for s, end in sums[d]]) for d in work]

  def ReplicaWait(self, layer: str) -> List[float]:
    """Per device (as Devices): seconds its sums waited, after its own last
    backward, for a slower replica's backward of the same stage: the
    replicas' imbalance, not the exchange."""
    work, ready, sums = self._AllReduceTimes(layer)
    return [max([0.0] + [min(end, ready.get(s, 0.0)) - work[d]
                         for s, end in sums[d]]) for d in work]

  def _AllReduceTimes(self, layer: str) -> Tuple[
      Dict[str, float], Dict[int, float], Dict[str, List[Tuple[int, float]]]]:
    """Per device its last backward's (or W's, or any work's) end; per stage
    the last end of its backwards over every replica; per device its
    all-reduces' (stage, end)."""
    work = {d: 0.0 for d in self.Devices(layer)}
    ready: Dict[int, float] = {}
    sums: Dict[str, List[Tuple[int, float]]] = {d: [] for d in work}
    for t in self._Mine(layer):
      if t.phase == schedule.ALL_REDUCE:
        sums[t.device].append((t.partition, t.end))
        continue
      work[t.device] = max(work[t.device], t.end)
      if t.phase != 'F':
        ready[t.partition] = max(ready.get(t.partition, 0.0), t.end)
    return work, ready, sums

  def Bubble(self, layer: str) -> float:
    """Measured idle fraction: 1 - mean busy fraction of its devices."""
    busy = self.BusyFractions(layer)
    return 1.0 - sum(busy) / len(busy)

  def IdealBubble(self, layer: str, measured: bool = True) -> float:
    """The idle share of the table that ran, simulated (schedule.Simulate)
    with each stage's measured mean forward and backward, or with
    `measured=False` unit forwards and backwards twice as long."""
    table = self.Table(layer)
    if not measured:
      return schedule.Simulate(table).bubble
    means = self.MeanSeconds(layer)
    return schedule.Simulate(table, means['F'], means['B'],
                             weight_s=means['W']).bubble

  def Summary(self) -> str:
    """One line per layer: span, bubbles, busy fractions; then the clocks."""
    lines = []
    for layer in self.Layers():
      begin, end = self.Span(layer)
      busy = ', '.join(
          f'{timeline.ShortDeviceName(d)} {b:.0%}'
          for d, b in zip(self.Devices(layer), self.BusyFractions(layer)))
      lines.append(
          f"{layer}: {_Shape(self, layer)}, step's pipeline "
          f'{(end - begin) * 1e3:.1f} ms, measured bubble '
          f'{self.Bubble(layer):.1%} (ideal for this order '
          f'{self.IdealBubble(layer):.1%}: its table simulated with the '
          f'measured mean F and B per stage); busy: {busy}')
    lines.append('clocks: ' + '; '.join(f'{where}: {how}' for where, how in
                                         sorted(self.clocks.items())))
    return '\n'.join(lines)

  def ChromeTrace(self) -> Dict[str, Any]:
    """Chrome trace event format: a process per device, times in us."""
    rows = _Rows(self)
    multi = _MultiStage(self)
    events = []
    for pid, (layer, device) in enumerate(rows):
      events.append({'ph': 'M', 'name': 'process_name', 'pid': pid,
                     'tid': 0, 'args': {'name': f'{layer} @ {device}'}})
      events.append({'ph': 'M', 'name': 'process_sort_index', 'pid': pid,
                     'tid': 0, 'args': {'sort_index': pid}})
    for t in self.tasks:
      pid = rows.index((t.layer, t.device))
      args = {'layer': t.layer, 'partition': t.partition,
              'micro_batch': t.micro_batch}
      events.append({
          'ph': 'X', 'name': timeline.Label(t.action, multi[t.layer]),
          'cat': {'F': 'forward', 'B': 'backward', 'W': 'weight',
                  'A': 'all-reduce'}[t.phase],
          'pid': pid, 'tid': 0, 'ts': t.start * 1e6,
          'dur': (t.end - t.start) * 1e6, 'args': args})
      if t.recomputed is not None:
        events.append({
            'ph': 'X', 'name': f'recompute {t.micro_batch}',
            'cat': 'recompute', 'pid': pid, 'tid': 0, 'ts': t.start * 1e6,
            'dur': (t.recomputed - t.start) * 1e6, 'args': args})
    return {'traceEvents': events, 'displayTimeUnit': 'ms',
            'otherData': {'clocks': self.clocks, 'summary': self.Summary()}}

  def Svg(self) -> str:
    return _Svg(self)

  def Write(self, path: str) -> Tuple[str, str]:
    """Writes PATH.json (Chrome trace) and PATH.svg; returns both paths."""
    base = path[:-5] if path.endswith('.json') else (
        path[:-4] if path.endswith('.svg') else path)
    if os.path.dirname(base):
      os.makedirs(os.path.dirname(base), exist_ok=True)
    with open(base + '.json', 'w', encoding='utf-8') as f:
      json.dump(self.ChromeTrace(), f)
    with open(base + '.svg', 'w', encoding='utf-8') as f:
      f.write(self.Svg())
    return base + '.json', base + '.svg'


def _Rows(trace: StepTrace) -> List[Tuple[str, str]]:
  """(layer, device) per row: layers in order, devices in order."""
  return [(layer, device) for layer in trace.Layers()
          for device in trace.Devices(layer)]


def _MultiStage(trace: StepTrace) -> Dict[str, bool]:
  """Per layer: whether its devices hold several stages (labels say
  which, as timeline.Label)."""
  return {layer: trace.Table(layer).num_stages > trace.Shape(layer)[0]
          for layer in trace.Layers()}


def _Named(table: schedule.Schedule) -> schedule.Schedule:
  """`table` named after the registered generator (registry.Make) that
  makes it, its backwards split or not."""
  k, s = table.num_devices, table.num_stages
  if not k or s % k:
    return table
  for name in registry.Names():
    if registry.Lookup(name).searched:
      continue
    try:
      made = registry.Make(name, k, table.num_micro_batches, s // k,
                           split_backward=table.split_backward)
    except ValueError:
      continue
    if (made.order, made.stage_devices) == (table.order,
                                            table.stage_devices):
      return made
  return table


def _Shape(trace: StepTrace, layer: str) -> str:
  """'K=2 M=4, 1f1b schedule', with V=.. before M when V > 1 and
  ', backwards split' after a generator's table split in place."""
  table = trace.Table(layer)
  k, s = table.num_devices, table.num_stages
  v = f' V={s // k}' if s > k else ''
  split = ', backwards split' if table.split_in_place else ''
  return (f'K={k}{v} M={table.num_micro_batches}, {table.name} '
          f'schedule{split}')


# ---- measuring ---------------------------------------------------------


def _TaskOf(device: str) -> Optional[str]:
  """'/job:worker/replica:0/task:1' for a device of another job, else None."""
  spec = tf.DeviceSpec.from_string(device)
  if spec.job in (None, 'localhost'):
    return None
  return f'/job:{spec.job}/replica:{spec.replica or 0}/task:{spec.task or 0}'


def ClockOffsets(devices: List[str], calls: int = 15
                 ) -> Dict[str, Tuple[float, float]]:
  """{worker task: (its clock - ours, uncertainty)} in seconds.

  Per task: the fastest of `calls` round trips running tf.timestamp()
  there; offset = stamp - middle of the call, uncertainty = half the
  round trip. Devices of this process are left out (same clock).
  """
  out = {}
  for task in sorted({t for t in map(_TaskOf, devices) if t}):
    def Stamp(where=task):
      with tf.device(where + '/device:CPU:0'):
        return tf.timestamp()
    stamp = tf.function(Stamp, autograph=False)
    stamp()  # traced and instantiated there
    best = None
    for _ in range(calls):
      before = time.time()
      value = float(stamp())
      after = time.time()
      if best is None or after - before < best[1] * 2:
        best = (value - (before + after) / 2, (after - before) / 2)
    out[task] = best
  return out


@contextlib.contextmanager
def TimestampsAllowed() -> Iterator[None]:
  """Within: TF's timestamp op runs even if op determinism is enabled.

  `tf.config.experimental.enable_op_determinism()` makes tf.timestamp
  fail ("cannot be called when determinism is enabled"); it is lifted here
  and restored on leaving (the process's other threads see it lifted
  meanwhile). Run stamped functions (RecordTasks) inside.
  """
  # TF 2.21 exports enable_op_determinism only; its query and its undo
  # live next to it in tensorflow.python.framework.config.
  from tensorflow.python.framework import config as tf_config  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
  deterministic = tf_config.is_op_determinism_enabled()
  if deterministic:
    tf_config.disable_op_determinism()
  try:
    yield
  finally:
    if deterministic:
      tf_config.enable_op_determinism()


class Tracer:
  """`fn(*args)` traced once with every pipeline task stamped; each `Run()`
  runs one step and returns its StepTrace.

  For many measured steps of one function (bench/planner compares each
  step's tasks with its span); Measure() is one of them after warm-up.
  The clocks' offsets are measured at the first Run() and kept.
  """

  def __init__(self, fn: Callable[..., Any], *args: Any):
    with stamps.RecordTasks() as recorder:
      def Stamped(*inner):
        # fn's outputs are returned too: what nothing reads, the runtime
        # prunes, and the step would not be the step.
        out = [t for t in tf.nest.flatten(fn(*inner)) if t is not None]
        return recorder.Tensors(), out
      self._concrete = tf.function(
          Stamped, autograph=False).get_concrete_function(*args)
    if not recorder.tasks:
      raise ValueError('step_trace: the function ran no PipeliningLayer, so '
                       'there is nothing to trace.')
    self._args = args
    self._tasks = recorder.tasks
    self._offsets: Optional[Dict[str, Tuple[float, float]]] = None
    self._clocks: Dict[str, str] = {}

  def Step(self) -> None:
    """One step, its stamps discarded (warm-up)."""
    with TimestampsAllowed():
      self._concrete(*self._args)

  def Run(self) -> StepTrace:
    """One step, measured."""
    with TimestampsAllowed():  # the measured run's results are discarded
      values = [float(v) for v in self._concrete(*self._args)[0]]
      if self._offsets is None:
        self._AlignClocks()
    stamps = []
    for i, task in enumerate(self._tasks):
      shift = self._offsets.get(_TaskOf(task.device), (0.0, 0.0))[0]
      start, end, mid = (v - shift for v in values[3 * i:3 * i + 3])
      stamps.append((task, start, end,
                     None if task.recomputed is None else mid))
    zero = min(s for _, s, _, _ in stamps)
    tasks = [MeasuredTask(
        t.layer, t.device, t.phase, t.partition, t.micro_batch, s - zero,
        e - zero, None if r is None else r - zero) for t, s, e, r in stamps]
    return StepTrace(tasks, dict(self._clocks))

  def _AlignClocks(self) -> None:
    devices = sorted({t.device for t in self._tasks})
    offsets = ClockOffsets(devices)
    if any(_TaskOf(d) is None for d in devices):
      self._clocks['this process'] = 'the trainer\'s own clock'
    for task, (offset, err) in list(offsets.items()):
      # Within its uncertainty the clock is indistinguishable from ours
      # (one host: the same clock); shifting by the estimate would add its
      # noise.
      applied = abs(offset) > err
      offsets[task] = (offset if applied else 0.0, err)
      self._clocks[task] = (
          f'offset {offset * 1e3:+.3f} ms +- {err * 1e3:.3f} ms from a round '
          'trip' + (', subtracted' if applied else
                    ': within its uncertainty, not shifted'))
    self._offsets = offsets


def Measure(fn: Callable[..., Any], *args: Any, warmup: int = 2
            ) -> StepTrace:
  """Runs fn(*args) as a tf.function warmup + 1 times; the last, measured.

  `fn` must run at least one PipeliningLayer (and usually its gradient);
  its outputs are computed, then discarded.
  """
  tracer = Tracer(fn, *args)
  for _ in range(max(warmup, 0)):
    tracer.Step()
  return tracer.Run()


def MeasureStep(task: Any, batch: Any, warmup: int = 2) -> StepTrace:
  """Measure() of one training step of `task`, without its update.

  Runs `task.Gradients(batch)`: the forward and backward of every replica,
  so the variables and the training that follows are unchanged.
  """
  return Measure(task.Gradients, batch, warmup=warmup)


# ---- the picture -------------------------------------------------------

_COLORS = dict(timeline.PHASE_COLORS, R='#f3c18f')  # R: re-computation
_LEFT, _TOP, _ROW_H, _BAR_H, _WIDTH = 260, 70, 34, 24, 900


def _Svg(trace: StepTrace) -> str:
  rows = _Rows(trace)
  end = max(t.end for t in trace.tasks) or 1e-9
  scale = _WIDTH / end
  height = _TOP + len(rows) * _ROW_H + 60
  esc = saxutils.escape
  out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_LEFT + _WIDTH + 30}'
         f'" height="{height}" font-family="sans-serif" font-size="12">',
         '<rect width="100%" height="100%" fill="white"/>',
         '<text x="10" y="20" font-size="15">One training step as it ran '
         '(measured, forward and backward; the update is not shown)</text>']
  y = 40
  for layer in trace.Layers():
    out.append(
        f'<text x="10" y="{y}">{esc(layer)}: {_Shape(trace, layer)}: '
        f'measured bubble {trace.Bubble(layer):.1%}, ideal for this order '
        f'{trace.IdealBubble(layer):.1%}</text>')
    y += 16
  top = max(_TOP, y)
  busy = {}
  for layer in trace.Layers():
    for d, b in zip(trace.Devices(layer), trace.BusyFractions(layer)):
      busy[(layer, d)] = b
  for i, (layer, device) in enumerate(rows):
    row_y = top + i * _ROW_H
    out.append(f'<text x="10" y="{row_y + 16}">'
               f'{esc(timeline.ShortDeviceName(device))} '
               f'({busy[(layer, device)]:.0%} busy)</text>')
    out.append(f'<rect x="{_LEFT}" y="{row_y}" width="{_WIDTH}" '
               f'height="{_BAR_H}" fill="{timeline.IDLE_COLOR}"/>')
  out += _SvgTasks(trace, rows, top, scale)
  axis_y = top + len(rows) * _ROW_H + 4
  step = _TickStep(end * 1e3)
  tick = 0.0
  while tick <= end * 1e3 + 1e-9:
    x = _LEFT + tick / 1e3 * scale
    out.append(f'<line x1="{x:.2f}" y1="{axis_y}" x2="{x:.2f}" '
               f'y2="{axis_y + 5}" stroke="black"/>')
    out.append(f'<text x="{x:.2f}" y="{axis_y + 18}" text-anchor="middle">'
               f'{tick:g}</text>')
    tick += step
  split = any(t.phase == 'W' for t in trace.tasks)
  colours = ('blue forward, orange input gradient (B), green weight '
             'gradient (W)' if split else 'blue forward, orange backward, '
             'light orange its re-computation')
  out.append(f'<text x="{_LEFT + _WIDTH / 2}" y="{axis_y + 36}" '
             'text-anchor="middle">ms from the first task\'s start; '
             f'{colours}, grey idle</text>')
  out.append('</svg>')
  return '\n'.join(out) + '\n'


def _SvgTasks(trace: StepTrace, rows: List[Tuple[str, str]], top: float,
              scale: float) -> List[str]:
  """A box per task on its device's row (and its re-computation's); the
  label names the stage too when a device holds several."""
  multi = _MultiStage(trace)
  esc = saxutils.escape
  out = []
  for t in trace.tasks:
    row_y = top + rows.index((t.layer, t.device)) * _ROW_H
    x0, x1 = _LEFT + t.start * scale, _LEFT + t.end * scale
    label = timeline.Label(t.action, multi[t.layer])
    title = (f'{t.name} stage {t.partition}: {t.start * 1e3:.2f}-'
             f'{t.end * 1e3:.2f} ms')
    out.append(f'<rect x="{x0:.2f}" y="{row_y}" width="{max(x1 - x0, 0.5):.2f}'
               f'" height="{_BAR_H}" fill="{_COLORS[t.phase]}" '
               f'stroke="white" stroke-width="0.5"><title>{esc(title)}'
               '</title></rect>')
    if t.recomputed is not None:
      xr = _LEFT + t.recomputed * scale
      out.append(f'<rect x="{x0:.2f}" y="{row_y}" width="'
                 f'{max(xr - x0, 0.5):.2f}" height="{_BAR_H}" '
                 f'fill="{_COLORS["R"]}"><title>re-computation of '
                 f'{esc(title)}</title></rect>')
    if x1 - x0 > 7 * len(label) + 4:
      out.append(f'<text x="{(x0 + x1) / 2:.2f}" y="{row_y + 16}" '
                 f'text-anchor="middle" fill="white">{label}</text>')
  return out


def _TickStep(total_ms: float) -> float:
  """1, 2 or 5 times a power of ten: the largest giving at least 5 ticks."""
  power = 10.0 ** int(f'{max(total_ms, 1e-9):e}'.split('e')[1])
  for step in (5 * power, 2 * power, power, power / 2, power / 5):
    if total_ms / step >= 5:
      return step
  return power / 10
