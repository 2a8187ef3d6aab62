"""`--max_restarts=N`: the trainer goes on after losing a worker.

The trainer process becomes a supervisor that runs the training itself as
a child (the same command, one restart budget lower in no way: the child
is told by the environment where to note a lost worker):

  supervisor (the command the user ran)
    |  the same command in a child, its own session, dies with this process
    +-- trainer child: starts its local workers (or connects to the
        cluster), restores the newest checkpoint, trains

A child that loses a worker notes which one in the file named by
LOST_WORKER_ENV and exits LOST_WORKER_STATUS, its local workers stopped on
the way out. The supervisor prints one line naming the task and the step
the next child resumes from, and starts it: a fresh set of local workers,
or, on a cluster, the wait (--worker_timeout_secs) for the lost task's
address to answer again (its pod restarted by Kubernetes, its process by
systemd). After `max_restarts` restarts, the next loss ends the run with
the child's own one-line error. Any other exit of the child (done, an
error, a stop signal) is the supervisor's.

Signals: the child runs in its own session, so a terminal's Ctrl-C reaches
the supervisor alone, which hands SIGINT and SIGTERM on once each (the child
then writes its step's checkpoint, core/interrupts.py). If the supervisor
is killed outright, Linux kills the child (its parent-death signal), and
the child's workers with it.

This module imports no TensorFlow.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from typing import Callable, List, Optional, Sequence

from lingvo_pipe.core import local_workers

# The child notes the lost worker as JSON {"task", "address", "why",
# "line"} in the file this names, then exits LOST_WORKER_STATUS.
LOST_WORKER_ENV = 'LINGVO_PIPE_LOST_WORKER_FILE'
LOST_WORKER_STATUS = 75  # EX_TEMPFAIL: try again later


def Supervised() -> Optional[str]:
  """In a supervised child: the file to note a lost worker in; else None."""
  return os.environ.get(LOST_WORKER_ENV) or None


def NoteLostWorker(path: str, task: int, address: str, why: str,
                   line: str) -> None:
  """Writes what the supervisor needs to say which worker went away."""
  with open(path, 'w', encoding='utf-8') as f:
    json.dump({'task': task, 'address': address, 'why': why, 'line': line},
              f)


def Supervise(command: Sequence[str], max_restarts: int,
              latest_checkpoint: Callable[[], Optional[str]],
              say: Callable[[str], None]) -> int:
  """Runs `command` as the trainer child, again after each lost worker,
  at most `max_restarts` times; returns the exit status to end with.

  `latest_checkpoint()` names the checkpoint a new child will resume
  from (None: none yet); `say` prints a line to the console.
  """
  fd, note = tempfile.mkstemp(prefix='lingvo_pipe_lost_', suffix='.json')
  os.close(fd)
  env = dict(os.environ, **{LOST_WORKER_ENV: note})
  child: List[Optional[subprocess.Popen]] = [None]
  stopped: List[int] = []  # the stop signals that came

  def HandOn(signum, unused_frame):
    stopped.append(signum)
    if child[0] is not None and child[0].poll() is None:
      child[0].send_signal(signum)

  previous = {s: signal.signal(s, HandOn)
              for s in (signal.SIGINT, signal.SIGTERM)}
  try:
    restarts = 0
    while True:
      _Remove(note)
      child[0] = subprocess.Popen(list(command), env=env,
                                  start_new_session=True,
                                  preexec_fn=local_workers.DieWithParent())
      if stopped:  # it came while the child started: hand it on now
        child[0].send_signal(stopped[0])
      status = _Wait(child[0])
      lost = _Read(note) if status == LOST_WORKER_STATUS else None
      if lost is None:
        return status
      if stopped:  # asked to stop: no new child
        return 128 + stopped[0]
      if restarts >= max_restarts:
        say(f"error: {lost['line']} (after {restarts} restart(s), "
            f'--max_restarts={max_restarts})')
        return 1
      restarts += 1
      latest = latest_checkpoint()
      where = (f'resuming from {os.path.basename(latest)} at step '
               f"{latest.rsplit('-', 1)[-1]}" if latest else
               'starting over (no checkpoint yet)')
      say(f"Restart {restarts} of {max_restarts}: worker task {lost['task']} "
          f"at {lost['address']} went away ({lost['why']}); {where}.")
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)
    if child[0] is not None and child[0].poll() is None:
      child[0].kill()
      child[0].wait()
    _Remove(note)


def _Wait(proc: subprocess.Popen) -> int:
  """The child's exit status as a shell reports it (128 + signal). The
  wait goes on through HandOn (PEP 475: it raises nothing)."""
  code = proc.wait()
  return 128 - code if code < 0 else code


def _Read(path: str) -> Optional[dict]:
  try:
    with open(path, encoding='utf-8') as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def _Remove(path: str) -> None:
  try:
    os.remove(path)
  except OSError:
    pass


def ChildCommand(argv: Sequence[str]) -> List[str]:
  """This process's command again, as the supervised child runs it."""
  return [sys.executable, '-m', 'lingvo_pipe.trainer'] + list(argv[1:])
