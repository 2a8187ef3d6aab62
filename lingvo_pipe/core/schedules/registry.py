"""The schedules' catalogue: every schedule by name, its rules checked.

A schedule is one definition (`schedule.Definition`: its generator, its
placement and its rules) registered where its generator is written:
schedule.py's own (gpipe, 1f1b, interleaved_1f1b, zb_h1), and one file
each in this package (zb_v, interleaved_zb, looped_bfs, auto). This
module imports every module of the package, so a new file there is a new
schedule, and answers for any of them, or for a table in a .csv file
(schedule_file.py):

  Names()                     every registered name
  Lookup(name)                its definition
  Check(name, S, M, V, ...)   K, or a one-line error naming the rule
  Placement(name, K, V)       each stage's device
  Make(name, K, M, V, split)  the table, checked and validated

Nothing else in the library asks a schedule's name: the pipeline, the
planner, the step model and the timeline read the table.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from typing import Optional, Tuple

from lingvo_pipe.core import schedule
from lingvo_pipe.core import schedule_file


def _ImportPackage() -> None:
  """Imports each module beside this one: each registers its schedule."""
  here = os.path.dirname(__file__)
  for module in sorted(m.name for m in pkgutil.iter_modules([here])):
    if module != 'registry':
      importlib.import_module(f'{__package__}.{module}')


_ImportPackage()

def Names() -> Tuple[str, ...]:
  """Every registered schedule, in registration order."""
  return tuple(schedule.Defined())


def Lookup(name: str) -> schedule.Definition:
  """The definition of `name`: a registered schedule, or a table in a
  CSV file (a path ending in '.csv', schedule_file.py)."""
  defined = schedule.Defined()
  if name in defined:
    return defined[name]
  if isinstance(name, str) and name.endswith('.csv'):
    return schedule_file.Definition(name)
  raise ValueError(f'Unknown schedule {name!r}; use one of {Names()} or '
                   "a table's .csv file.")


def Check(name: str, num_stages: int,
          num_micro_batches: Optional[int] = None,
          num_virtual_stages: int = 1, recompute: str = 'never',
          split_backward: bool = False) -> int:
  """K, the devices a replica runs schedule `name` on; raises ValueError
  (one line: the schedule, the rule, what to set) if S stages, V a
  device, M micro-batches (None: not yet known) or the recompute mode
  break a rule of its definition."""
  defn = Lookup(name)
  where = f'Schedule {name!r}'
  v, s_total = num_virtual_stages, num_stages
  if defn.num_stages is not None and s_total != defn.num_stages:
    raise ValueError(f'{where} has {defn.num_stages} stages; give it '
                     f'{defn.num_stages} cells, not {s_total}.')
  if defn.num_devices is None and (
      not isinstance(v, int) or v < 1 or s_total % v):
    raise ValueError(
        f'{where}: num_virtual_stages={v!r} must be a positive divisor of '
        f'the {s_total} cells (K = cells / V devices).')
  least, most = defn.stages_per_device
  if defn.num_devices is None and not least <= v <= (most or v):
    want = (f'num_virtual_stages={least}' if least == most else
            f'num_virtual_stages >= {least}')
    raise ValueError(f'{where} runs {_Range(least, most)} per '
                     f'device, got num_virtual_stages={v}; set {want} '
                     '(and as many times K cells).')
  k = defn.NumDevices(s_total, v)
  if (defn.splits_backward or split_backward) and recompute != 'never':
    what = ('splits each backward in B and W' if defn.splits_backward
            else 'with split_backward splits each backward')
    raise ValueError(f"{where} {what}, which needs every stage's "
                     "activations kept: set recompute='never' (got "
                     f'{recompute!r}).')
  if num_micro_batches is not None:
    _CheckMicroBatches(defn, where, k, num_micro_batches)
  return k


def _Range(least: int, most: Optional[int]) -> str:
  """'one stage', '2 stages', '2 or more stages', '1 to 4 stages'."""
  if least == most:
    return 'one stage' if least == 1 else f'{least} stages'
  return (f'{least} or more stages' if most is None else
          f'{least} to {most} stages')


def _CheckMicroBatches(defn: schedule.Definition, where: str, k: int,
                       m: int) -> None:
  if m < 1:
    raise ValueError(f'{where}: M={m}; set num_micro_batches >= 1.')
  if defn.num_micro_batches is not None and m != defn.num_micro_batches:
    raise ValueError(f'{where} is a table of {defn.num_micro_batches} '
                     f'micro-batches; set num_micro_batches='
                     f'{defn.num_micro_batches}, not {m}.')
  if defn.m_multiple_of_k and m % k:
    options = sorted({k * max(1, m // k), k * (m // k + 1)})
    raise ValueError(
        f'{where} needs M a multiple of K: M={m}, K={k}; set '
        f'num_micro_batches to {" or ".join(map(str, options))}.')
  least = defn.least_micro_batches(k)
  if m < least:
    raise ValueError(f'{where} needs at least {least} micro-batches with '
                     f'K={k}; set num_micro_batches >= {least}, not {m}.')


def Placement(name: str, num_devices: int,
              num_virtual_stages: int = 1) -> Tuple[int, ...]:
  """The device of each stage under schedule `name` (its definition's)."""
  return tuple(Lookup(name).placement(num_devices, num_virtual_stages))


def Make(name: str, num_devices: int, num_micro_batches: int,
         num_virtual_stages: int = 1,
         split_backward: bool = False) -> schedule.Schedule:
  """The table of schedule `name` (a registered one, or a .csv file),
  checked against its rules and validated; with `split_backward`, each B
  followed by its W (SplitBackwards)."""
  defn = Lookup(name)
  v = num_virtual_stages
  s_total = (defn.num_stages if defn.num_stages is not None
             else num_devices * v)
  k = Check(name, s_total, num_micro_batches, v)
  if k != num_devices:
    raise ValueError(f'Schedule {name!r} runs on {k} devices; use K={k}, '
                     f'not {num_devices}.')
  table = defn.make(num_devices, num_micro_batches, v)
  placed = tuple(defn.placement(num_devices, v))
  if table.stage_devices != placed:
    raise ValueError(f'Schedule {name!r}: its table puts the stages on '
                     f'devices {table.stage_devices}, its definition on '
                     f'{placed}; make them agree.')
  if split_backward:
    table = schedule.SplitBackwards(table)
  schedule.Validate(table)
  return table
