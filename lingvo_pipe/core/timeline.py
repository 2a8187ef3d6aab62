"""The pipeline schedule as a picture (SVG), for people who would rather look.

One row per device, one column per clock tick; forward tasks blue,
backward tasks orange, idle ticks (the bubble) left grey:

  dev 0 | F0 F1 F2 F3 .  .  .  B3 B2 B1 B0
  dev 1 | .  F0 F1 F2 F3 .  B3 B2 B1 B0 .
  ...

The trainer writes one `pipeline_<layer>.svg` per PipeliningLayer into the
logdir. Plain SVG text: no plotting library needed, any browser shows it.
"""

from __future__ import annotations

from typing import List
from xml.sax import saxutils

import tensorflow as tf

from lingvo_pipe.core import schedule

_CELL_W, _CELL_H, _LEFT, _TOP = 34, 26, 190, 48
# Forward blue, backward orange (step_trace's measured picture uses them too).
PHASE_COLORS = {'F': '#4a90d9', 'B': '#e8913a'}


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


def ScheduleSvg(num_partitions: int, num_micro_batches: int,
                devices: List[str], title: str = '') -> str:
  """An SVG document of the GPipe schedule for K partitions, M batches."""
  if len(devices) != num_partitions:
    raise ValueError(
        f'ScheduleSvg got {len(devices)} device names for {num_partitions} '
        'partitions; pass one per partition.')
  tasks = schedule.GPipeSchedule(num_partitions, num_micro_batches)
  ticks = max(t.tick for t in tasks) + 1
  width = _LEFT + max(ticks * _CELL_W, 540) + 20
  height = _TOP + num_partitions * _CELL_H + 40
  bubble = schedule.BubbleFraction(num_partitions, num_micro_batches)
  heading = (f'{title}  K={num_partitions} partitions, '
             f'M={num_micro_batches} micro-batches, bubble {bubble:.1%}')
  out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
         f'height="{height}" font-family="monospace" font-size="12">',
         f'<text x="10" y="20" font-size="14">'
         f'{saxutils.escape(heading.strip())}</text>']
  for k, device in enumerate(devices):
    y = _TOP + k * _CELL_H
    label = f'{k}: {ShortDeviceName(device)}'
    out.append(f'<text x="10" y="{y + 17}">{saxutils.escape(label)}</text>')
    out.append(f'<rect x="{_LEFT}" y="{y}" width="{ticks * _CELL_W}" '
               f'height="{_CELL_H - 2}" fill="#eeeeee"/>')
  for t in tasks:
    x, y = _LEFT + t.tick * _CELL_W, _TOP + t.partition * _CELL_H
    out.append(f'<rect x="{x + 1}" y="{y}" width="{_CELL_W - 2}" '
               f'height="{_CELL_H - 2}" fill="{PHASE_COLORS[t.phase]}"/>')
    out.append(f'<text x="{x + 6}" y="{y + 17}" fill="white">'
               f'{t.phase}{t.micro_batch}</text>')
  legend_y = _TOP + num_partitions * _CELL_H + 24
  out.append(f'<text x="{_LEFT}" y="{legend_y}">clock tick -&gt;   '
             'F = forward, B = backward (re-computes first), grey = idle'
             '</text>')
  out.append('</svg>')
  return '\n'.join(out) + '\n'
