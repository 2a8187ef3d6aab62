"""Ctrl-C and SIGTERM for the trainer: stop where it is safe, and say so.

Kubernetes, Slurm and preemptible VMs send SIGTERM some time before they
kill a job; a user sends SIGINT with Ctrl-C. `Install()` routes both here.

  outside `Deferred()`  the first signal raises KeyboardInterrupt where
                        Python is, unless that is inside TensorFlow or a
                        finalizer (below): there it is noted, and the next
                        `RaiseIfRequested()` raises it.
  inside `Deferred()`   (the trainer's loop) the first signal is only
                        noted: the step in flight finishes, the loop's next
                        `RaiseIfRequested()` raises, and the trainer writes
                        a checkpoint of that step before it exits.
  a second signal       raises at once, wherever Python is.

Why not raise inside TensorFlow: an exception raised asynchronously in code
that C called back (seen: SystemError from listobject.c while a checkpoint
save traced a function) or in a `__del__` (Python prints "Exception
ignored" and goes on) does not stop the trainer cleanly.

`ExitStatus()` is 128 + the first signal's number (130 for SIGINT, 143 for
SIGTERM), what a process that signal killed reports: schedulers read it as
"stopped from outside, may run again" (docs/DESIGN.md section 35).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Any, Iterator

_LIBRARIES = ('tensorflow', 'keras', 'tf_keras', 'tensorboard')
_NAMES = {signal.SIGINT: b'Ctrl-C', signal.SIGTERM: b'SIGTERM'}

_requested = 0  # the first stop signal's number; 0 before any came
_raised = False  # a signal handler raised KeyboardInterrupt
_deferring = False  # inside Deferred()
_reason = ''  # why a stop was asked for, where no signal to this process


def Install() -> None:
  """Routes SIGINT (unless ignored, as in a background job) and SIGTERM
  (unless someone else handles it) to this module."""
  if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _OnSignal)
  if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
    signal.signal(signal.SIGTERM, _OnSignal)


def Reset() -> None:
  """Forgets the signals seen so far (tests)."""
  global _requested, _raised, _reason
  _requested, _raised, _reason = 0, False, ''


def Request(signum: int, reason: str) -> None:
  """Asks for a stop as signal `signum` would, for `reason` (e.g. a worker
  was told to stop), from any thread: the next RaiseIfRequested raises,
  resumably. Nothing if a stop was asked for already."""
  global _requested, _reason
  if not _requested:
    _requested, _reason = signum, reason
    os.write(2, b'\n' + reason.encode() + b': stopping after the step in '
             b'flight to write its checkpoint.\n')


def Reason() -> str:
  """Why the stop came, if not by a signal to this process; else ''."""
  return _reason


def Requested() -> int:
  """The first stop signal's number, or 0."""
  return _requested


def Resumable() -> bool:
  """A stop was asked for once, and noted without raising: whatever the
  loop was doing finished, so its state is whole and may be saved."""
  return bool(_requested) and not _raised


def ExitStatus() -> int:
  """128 + the first stop signal (SIGINT where none came)."""
  return 128 + int(_requested or signal.SIGINT)


def RaiseIfRequested() -> None:
  """Raises KeyboardInterrupt if a stop signal came, even where the
  first one was noted and not raised."""
  if _requested:
    raise KeyboardInterrupt


@contextlib.contextmanager
def Deferred() -> Iterator[None]:
  """Within: the first stop signal waits for the next RaiseIfRequested."""
  global _deferring
  before, _deferring = _deferring, True
  try:
    yield
  finally:
    _deferring = before


def _UnsafeToRaiseIn(frame: Any) -> bool:
  """Whether a finalizer or a loaded library's code is on the stack."""
  dirs = tuple(os.path.join(path, '') for name in _LIBRARIES
               for path in getattr(sys.modules.get(name), '__path__', ()))
  while frame is not None:
    code = frame.f_code
    if code.co_name == '__del__' or code.co_filename.startswith(dirs):
      return True
    frame = frame.f_back
  return False


def _OnSignal(signum: int, frame: Any) -> None:
  global _requested, _raised
  if not _requested:
    _requested = signum
    name = _NAMES.get(signum, b'A stop signal')
    if _deferring:
      os.write(2, b'\n' + name + b': stopping after the step in flight to '
               b'write its checkpoint; Ctrl-C again stops at once.\n')
      return
    if _UnsafeToRaiseIn(frame):
      os.write(2, b'\n' + name + b': stopping at the next safe point; '
               b'Ctrl-C again stops at once.\n')
      return
  _raised = True
  raise KeyboardInterrupt
