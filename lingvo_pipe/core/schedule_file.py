"""A schedule as a CSV file: a user's own table, or one to share.

The format is torch.distributed.pipelining's "compute_only" CSV: one row
per device, one cell per action in the device's order, written
`<stage><kind><micro-batch>`; an empty cell is an idle slot (ignored).

  kind  meaning                                      our Action
  F     forward                                      F(s, m)
  B     whole backward (inputs' and weights' grads)  B(s, m), whole
  I     input gradient of a split backward           B(s, m), split
  W     weight gradient of a split backward          W(s, m)

A table either splits every backward (I and W) or none (B). A stage runs
on the device whose row lists it; M is one more than the largest
micro-batch. For example, 1F1B at K=2, M=2:

  0F0,0F1,,0B0,0B1
  ,1F0,1B0,1F1,1B1

`Load` reads and validates one (an error names the row, the cell and
what is wrong); `Dump` writes a table, idle slots as empty cells where a
unit-cost run of it idles, so a spreadsheet shows its shape. A
PipeliningLayer takes a file as its schedule (p.schedule = 'path.csv').
"""

from __future__ import annotations

import csv
import os
import re
from typing import Dict, List, Tuple

from lingvo_pipe.core import schedule

_CELL = re.compile(r'^(\d+)([FBIW])(\d+)$')
_CACHE: Dict[Tuple[str, int, int], schedule.Definition] = {}


def _Where(path: str, row: int, col: int, text: str) -> str:
  return f'Schedule file {path}: row {row + 1}, cell {col + 1} {text!r}'


def _Parse(path: str, rows: List[List[str]]
           ) -> Tuple[List[List[schedule.Action]], Dict[int, int], str]:
  """Per device its actions; stage -> device; the backward kind ('B',
  'I' or '' if none)."""
  order, devices, kind, first = [], {}, '', None
  for d, row in enumerate(rows):
    actions = []
    for j, text in enumerate(row):
      text = text.strip()
      if not text:
        continue
      match = _CELL.match(text)
      if not match:
        raise ValueError(f'{_Where(path, d, j, text)} is not an action; '
                         'write <stage><F|B|I|W><micro-batch>, e.g. 0F1.')
      stage, phase, m = int(match[1]), match[2], int(match[3])
      if stage in devices and devices[stage] != d:
        raise ValueError(f'{_Where(path, d, j, text)}: stage {stage} is '
                         f'already on row {devices[stage] + 1}; list each '
                         "stage's actions on one row.")
      devices[stage] = d
      if phase in 'BI':
        if kind and phase != kind:
          raise ValueError(
              f'{_Where(path, d, j, text)}: the table mixes whole (B) and '
              f'split (I) backwards (first {first}); use one kind.')
        kind, first = phase, first or text
      if phase == 'W' and kind == 'B':
        raise ValueError(f'{_Where(path, d, j, text)}: W goes with split '
                         'backwards (I), not B.')
      actions.append(schedule.Action('B' if phase == 'I' else phase,
                                     stage, m))
    order.append(actions)
  return order, devices, kind


def Load(path: str) -> schedule.Schedule:
  """The table in CSV file `path` (module docstring), validated; its name
  is the path. Raises ValueError of one line."""
  try:
    with open(path, newline='', encoding='utf-8') as f:
      rows = list(csv.reader(f))
  except OSError as err:
    raise ValueError(f'Schedule file {path}: cannot read it '
                     f'({err.strerror}); give a path to a .csv table.'
                     ) from None
  while rows and not any(c.strip() for c in rows[-1]):
    rows.pop()
  if not rows:
    raise ValueError(f'Schedule file {path} has no rows; write one row '
                     'of actions per device.')
  order, devices, kind = _Parse(path, rows)
  num_stages = max(devices) + 1 if devices else 0
  missing = sorted(set(range(num_stages)) - set(devices))
  if not devices or missing:
    raise ValueError(f'Schedule file {path} lists no action of stage '
                     f'{missing[0] if missing else 0}; every stage from 0 '
                     'needs its actions.')
  if kind == 'I' and not any(a.phase == 'W' for row in order for a in row):
    raise ValueError(f'Schedule file {path} splits backwards (I) but has '
                     'no W; add each W(s, m) after its I.')
  m_total = 1 + max(a.micro_batch for row in order for a in row)
  table = schedule.Schedule(
      path, m_total, tuple(devices[s] for s in range(num_stages)),
      tuple(tuple(row) for row in order))
  schedule.Validate(table)  # its errors name the table: the path
  return table


def Cells(table: schedule.Schedule) -> List[List[str]]:
  """The table's rows as CSV cells, idle slots empty (module docstring)."""
  split = table.split_backward
  ticks = schedule.Ticks(table)
  rows = []
  for row in table.order:
    cells: List[str] = []
    for a in row:
      if a.phase == schedule.ALL_REDUCE:
        continue
      cells += [''] * (ticks[a] - len(cells))
      kind = 'I' if split and a.phase == 'B' else a.phase
      cells.append(f'{a.stage}{kind}{a.micro_batch}')
    rows.append(cells)
  return rows


def Dump(table: schedule.Schedule, path: str) -> None:
  """Writes `table` to CSV file `path` (Load reads it back; so does torch's
  compute_only `_load_csv`)."""
  schedule.Validate(table)
  with open(path, 'w', newline='', encoding='utf-8') as f:
    csv.writer(f).writerows(Cells(table))


def Definition(path: str) -> schedule.Definition:
  """The schedule in file `path` as a definition: its K, stages and M
  fixed by the file, placed as it lists them (cached while the file is
  unchanged)."""
  try:
    stat = os.stat(path)
  except OSError as err:
    raise ValueError(f'Schedule file {path}: cannot read it '
                     f'({err.strerror}); give a path to a .csv table.'
                     ) from None
  key = (os.path.realpath(path), stat.st_mtime_ns, stat.st_size)
  if key not in _CACHE:
    table = Load(path)
    _CACHE[key] = schedule.Definition(
        path, lambda k, m, v: table, placement=lambda k, v: table.stage_devices,
        stages_per_device=(1, None), splits_backward=table.split_backward,
        num_devices=table.num_devices, num_stages=table.num_stages,
        num_micro_batches=table.num_micro_batches)
  return _CACHE[key]
