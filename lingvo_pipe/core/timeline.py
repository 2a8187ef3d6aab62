"""A schedule's table as a picture (SVG), for people who would rather look.

One row per device; each action a box placed where `schedule.Simulate`
runs it with unit forwards and backwards twice as long, its width its
duration; forwards blue, backwards orange, idle time (the bubble) grey.
1F1B, K=2, M=3 (a column is one unit of time):

  dev 0 | F0 F1 .  .  B0 B0 F2 B1 B1 .  B2 B2
  dev 1 | .  F0 B0 B0 F1 B1 B1 F2 B2 B2 .  .      bubble 25.0%

A box is labelled F<m> / B<m>, plus s<stage> when a device holds several
stages (interleaved schedules). The trainer writes one
`pipeline_<layer>.svg` per PipeliningLayer into the logdir, of the table
it trains with. Plain SVG text: no plotting library needed.
"""

from __future__ import annotations

from typing import Sequence
from xml.sax import saxutils

import tensorflow as tf

from lingvo_pipe.core import schedule

_UNIT_W, _CELL_H, _LEFT, _TOP = 36, 26, 190, 48
# Forward blue, backward orange, weight gradient (zero bubble's W) green;
# step_trace's measured picture uses them too.
PHASE_COLORS = {'F': '#4a90d9', 'B': '#e8913a', 'W': '#5aa05a',
                'A': '#9b6bc4'}
IDLE_COLOR = '#eeeeee'


def ShortDeviceName(name: str) -> str:
  """'CPU:1', or 'worker/task:1 CPU:0' for a device of another job."""
  try:
    spec = tf.DeviceSpec.from_string(name)
  except ValueError:
    return name
  if spec.device_type is None:
    return name
  short = f'{spec.device_type}:{spec.device_index or 0}'
  if spec.job not in (None, 'localhost'):
    short = f'{spec.job}/task:{spec.task or 0} {short}'
  return short


def Label(action: schedule.Action, multi_stage: bool) -> str:
  """'F3', or 'F3s5' when devices hold several stages."""
  return action.short + (f's{action.stage}' if multi_stage else '')


def Heading(table: schedule.Schedule, bubble: float, title: str = '') -> str:
  """'<title>  <name> schedule, K=.., [V=..,] M=.., bubble ..%'."""
  k, s = table.num_devices, table.num_stages
  shape = (f'K={k} devices x V={s // k} stages' if s > k else
           f'K={k} partitions')
  return (f'{title}  {table.name} schedule, {shape}, '
          f'M={table.num_micro_batches} micro-batches, bubble {bubble:.1%}'
          ).strip()


def ScheduleSvg(table: schedule.Schedule, devices: Sequence[str],
                title: str = '') -> str:
  """An SVG document of `table`, one row per device (module docstring).

  `devices[d]` names device d of the table (e.g. `layer.devices`); the
  heading gives the table's name, K, V, M and its simulated bubble.
  """
  if len(devices) != table.num_devices:
    raise ValueError(
        f'ScheduleSvg got {len(devices)} device names for a table of '
        f'{table.num_devices} devices; pass one per device.')
  sim = schedule.Simulate(table)
  width = _LEFT + max(int(sim.step * _UNIT_W), 540) + 20
  height = _TOP + table.num_devices * _CELL_H + 40
  esc = saxutils.escape
  out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
         f'height="{height}" font-family="monospace" font-size="12">',
         f'<text x="10" y="20" font-size="14">'
         f'{esc(Heading(table, sim.bubble, title))}</text>']
  for d, device in enumerate(devices):
    y = _TOP + d * _CELL_H
    label = f'{d}: {ShortDeviceName(device)}'
    out.append(f'<text x="10" y="{y + 17}">{esc(label)}</text>')
    out.append(f'<rect x="{_LEFT}" y="{y}" width="{sim.step * _UNIT_W:g}" '
               f'height="{_CELL_H - 2}" fill="{IDLE_COLOR}"/>')
  multi = table.num_stages > table.num_devices
  for d, row in enumerate(table.order):
    y = _TOP + d * _CELL_H
    for a in row:
      start, end = sim.times[a]
      x, w = _LEFT + start * _UNIT_W, (end - start) * _UNIT_W
      out.append(f'<rect x="{x + 1:g}" y="{y}" width="{max(w - 2, 1):g}" '
                 f'height="{_CELL_H - 2}" fill="{PHASE_COLORS[a.phase]}"/>')
      out.append(f'<text x="{x + w / 2:g}" y="{y + 17}" text-anchor='
                 f'"middle" fill="white">{Label(a, multi)}</text>')
  legend_y = _TOP + table.num_devices * _CELL_H + 24
  legend = ('(forward, B and W 1 each): F = forward, B = input gradient, '
            'W = weight gradient' if table.split_backward else
            '(forward 1, backward 2): F = forward, B = backward '
            '(re-computes first)')
  out.append(f'<text x="{_LEFT}" y="{legend_y}">time -&gt; {legend}, grey '
             '= idle</text>')
  out.append('</svg>')
  return '\n'.join(out) + '\n'
