"""Keeps TensorFlow's start-up chatter off the console.

Importing TensorFlow and listing its devices print C++ log lines that no
setting silences: they are logged before absl's C++ logging is set up, so
TF_CPP_MIN_LOG_LEVEL does not apply. On a machine without a GPU (TF 2.21):

  WARNING: All log messages before absl::InitializeLog() is called ...
  I0000 ... cudart_stub.cc:31] Could not find cuda drivers on your machine...
  I0000 ... cpu_feature_guard.cc:227] This TensorFlow binary is optimized...
  To enable the following instructions: AVX2 FMA, in other operations, ...
  E0000 ... cuda_platform.cc:52] failed call to cuInit: ...

and on a CPU with AVX-512 (seen on an AMD EPYC machine, 2026-11-26):

  I0000 ... port.cc:153] oneDNN custom operations are on. You may see ...

`ImportTensorFlow()` imports TensorFlow and lists its devices with file
descriptor 2 sent to a temporary file, then writes back every line it
caught except those: anything else (a real warning, a traceback) still
reaches the console, in order. Nothing here imports TensorFlow at module
level; call it before the first module that does.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import threading
from typing import Any, BinaryIO, Iterator

_LEVEL_ENV = 'TF_CPP_MIN_LOG_LEVEL'

# The known start-up lines (module docstring), by their start.
_NOISE = re.compile(
    r'(WARNING: All log messages before absl::InitializeLog\(\) is called'
    r'|[IWE]\d{4} [\d:. ]+\d+ (cudart_stub|cpu_feature_guard)\.cc:\d+\] '
    r'|[IWE]\d{4} [\d:. ]+\d+ port\.cc:\d+\] oneDNN custom operations are on'
    r'|E\d{4} [\d:. ]+\d+ cuda_platform\.cc:\d+\] failed call to cuInit'
    r'|To enable the following instructions: .*rebuild TensorFlow)')


def IsNoise(line: str) -> bool:
  """Whether `line` is one of TensorFlow's known start-up lines."""
  return _NOISE.match(line) is not None


@contextlib.contextmanager
def FilteredStderr() -> Iterator[None]:
  """Inside: fd 2 goes to a file; on leaving, all but the noise is written."""
  sys.stderr.flush()
  saved = os.dup(2)
  try:
    with tempfile.TemporaryFile() as caught:
      os.dup2(caught.fileno(), 2)
      try:
        yield
      finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        caught.seek(0)
        text = caught.read().decode('utf-8', errors='replace')
        kept = ''.join(line for line in text.splitlines(keepends=True)
                       if not IsNoise(line))
        if kept:
          os.write(2, kept.encode('utf-8'))
  finally:
    os.close(saved)


def ImportTensorFlow() -> Any:
  """`import tensorflow` and its device listing, without the noise.

  Also hides TensorFlow's C++ INFO lines for the rest of the run (sets
  TF_CPP_MIN_LOG_LEVEL=1, warnings and errors still shown) unless the
  variable is set already.
  """
  if not os.environ.get(_LEVEL_ENV):
    os.environ[_LEVEL_ENV] = '1'
  with FilteredStderr():
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.config.list_physical_devices()
  tf.get_logger().addFilter(_SaverRetracing())
  return tf


class _SaverRetracing(logging.Filter):
  """Drops TensorFlow's warnings that a function retraces where we mean it.

  With variables on several worker tasks, MultiDeviceSaver.save makes a new
  tf.function for every save, and from the fifth save on TensorFlow warns
  that "5 out of the last 5 calls ... triggered tf.function retracing" and
  tells the user to change their code: nothing of ours to change. The
  same for a task's step functions, traced once per length bucket's shape
  with task.train.one_trace_for_buckets off (the progress line notes
  each).
  """

  def filter(self, record: logging.LogRecord) -> bool:
    text = record.getMessage()
    return not ('retracing' in text and any(
        name in text for name in ('MultiDeviceSaver.save', 'Task.TrainStep',
                                  'Task.EvalStep', 'Task.DecodeStep')))


# What the runtime logs while a step on worker servers is cancelled (a
# worker died): each RecvTensor cancelled, each rendezvous aborted, with
# the lines that continue them.
_CANCELLED = re.compile(
    r'[WE]\d{4} [\d:. ]+\d+ (grpc_worker_service\.cc:\d+\] RecvTensor '
    r'cancelled|local_rendezvous\.cc:\d+\] Local rendezvous is aborting)')
_CONTINUED = re.compile(r'[\t ]|:UNKNOWN:|Additional GRPC error information')


_console = [2]  # where WriteToConsole writes: fd 2, or what it was


def WriteToConsole(text: str) -> None:
  """Writes `text` to the console now, past CancelledStepLinesTo's copier
  (for a last line before os._exit, which would not wait for it)."""
  sys.stderr.flush()
  os.write(_console[-1], text.encode('utf-8'))


def _Forward(source: int, console: int, log: BinaryIO) -> None:
  """Copies source's lines to console, those of a cancelled step to log."""
  pending, to_log = b'', False
  while True:
    data = os.read(source, 65536)
    if not data:
      break
    *lines, pending = (pending + data).split(b'\n')
    for line in lines:
      text = line.decode('utf-8', errors='replace')
      to_log = (_CANCELLED.match(text) is not None or
                (to_log and _CONTINUED.match(text) is not None))
      if to_log:
        log.write(line + b'\n')
      else:
        os.write(console, line + b'\n')
  if pending:
    os.write(console, pending)
  log.flush()


@contextlib.contextmanager
def CancelledStepLinesTo(path: str) -> Iterator[None]:
  """Inside: what TensorFlow's runtime logs about a cancelled step (when a
  worker server goes away: a "RecvTensor cancelled" per pending tensor,
  "Local rendezvous is aborting", their continuation lines) is appended
  to `path` instead of reaching the console; everything else written to
  fd 2 reaches it, in order, as it comes (a thread copies a pipe)."""
  sys.stderr.flush()
  console = os.dup(2)
  source, sink = os.pipe()
  os.dup2(sink, 2)
  os.close(sink)
  with open(path, 'ab') as log:
    copier = threading.Thread(target=_Forward, args=(source, console, log),
                              daemon=True)
    copier.start()
    _console.append(console)
    try:
      yield
    finally:
      _console.remove(console)
      sys.stderr.flush()
      os.dup2(console, 2)  # the pipe's last writer goes: the copier ends
      copier.join(timeout=10)
      os.close(console)
      if not copier.is_alive():
        os.close(source)
