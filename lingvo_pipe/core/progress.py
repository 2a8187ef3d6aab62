"""A one-line progress display: step, loss, examples/s, ETA.

On a terminal the line is rewritten in place; otherwise (a log file, CI) a
full line is printed at most every `min_interval` seconds, so logs stay
short. The ETA is the remaining steps over the recent step rate (an
exponential moving average, so one slow step does not swing it). The
first update only starts the clock: the first step of a run includes
tracing the step function, which says nothing about the rate.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Dict, Optional, TextIO


def FormatDuration(seconds: float) -> str:
  """'1h02m', '3m05s', '42s'."""
  seconds = max(0, int(round(seconds)))
  hours, rest = divmod(seconds, 3600)
  minutes, secs = divmod(rest, 60)
  if hours:
    return f'{hours}h{minutes:02d}m'
  if minutes:
    return f'{minutes}m{secs:02d}s'
  return f'{secs}s'


class Progress:
  """Tracks steps towards `total_steps` and prints a status line."""

  def __init__(self, total_steps: int, start_step: int = 0,
               stream: Optional[TextIO] = None, min_interval: float = 5.0,
               clock: Callable[[], float] = time.monotonic):
    self._total = int(total_steps)
    self._stream = stream or sys.stdout
    self._tty = bool(getattr(self._stream, 'isatty', lambda: False)())
    self._min_interval = min_interval
    self._clock = clock
    self._last_step = int(start_step)
    self._last_time = clock()
    self._started = False
    self._last_print = None
    self._steps_per_sec: Optional[float] = None

  @property
  def steps_per_second(self) -> Optional[float]:
    return self._steps_per_sec

  def Eta(self, step: int) -> Optional[float]:
    """Seconds to `total_steps` at the recent rate; None before a rate."""
    if not self._steps_per_sec:
      return None
    return (self._total - step) / self._steps_per_sec

  def Update(self, step: int, batch_size: int,
             values: Dict[str, float], note: Optional[str] = None) -> str:
    """Records reaching `step`; returns the line (printed if due).

    With a `note` (a step that traced a new batch shape, say) the line
    ends with it and is printed now, and the step's time does not count
    in the rate.
    """
    now = self._clock()
    steps = step - self._last_step
    if not self._started:
      self._started = True
    elif note is None and steps > 0 and now > self._last_time:
      rate = steps / (now - self._last_time)
      self._steps_per_sec = rate if self._steps_per_sec is None else (
          0.7 * self._steps_per_sec + 0.3 * rate)
    self._last_step, self._last_time = step, now
    line = self.Line(step, batch_size, values)
    if note:
      line += f'  ({note})'
    due = (self._last_print is None or step >= self._total or note or
           now - self._last_print >= self._min_interval)
    if self._tty:
      self._stream.write('\r' + line + '\x1b[K')
      if step >= self._total or note:
        self._stream.write('\n')
      self._stream.flush()
    elif due:
      self._stream.write(line + '\n')
      self._stream.flush()
      self._last_print = now
    return line

  def Line(self, step: int, batch_size: int, values: Dict[str, float]) -> str:
    parts = [f'step {step}/{self._total}']
    parts += [f'{k} {v:.4g}' for k, v in values.items()]
    if self._steps_per_sec:
      parts.append(f'{self._steps_per_sec * batch_size:.1f} examples/s')
    eta = self.Eta(step)
    parts.append('ETA ' + (FormatDuration(eta) if eta is not None else '?'))
    return '  '.join(parts)
