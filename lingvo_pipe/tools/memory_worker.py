"""A worker server that reports its allocator on SIGUSR1, for memory benchmarks.

  python -m lingvo_pipe.tools.memory_worker --cluster_spec=worker=... \
      --task_index=i

serves task i of the cluster as `python -m lingvo_pipe.trainer
--job=server` does (`cluster.Serve`) and, on SIGUSR1, writes its devices'
allocator statistics to `ReportPath(address)` and starts a new peak.
A client reads them (bench/memory, bench/planner):

  client                                 memory worker of task k
    seq = the report's seq (0 if none)
    os.kill(pid, SIGUSR1)        ---->   Report(): seq + 1, each device's
                                         {current, peak} bytes, then its
                                         peak reset to current; written
    until the report's seq > seq <----   to a temporary file and renamed
    read it

`MemoryWorkers` starts such servers on this machine (`LocalWorkers`, the
same pinning and clean-up) and `ReadMemory()` reads all of them;
`ReadServerMemory` does it for any memory workers on this host by pid and
address. `TraceStep` (`MemoryWorkers.TraceStep`) runs a step with each
server's profiler on (SIGUSR2 starts it, the next SIGUSR1 report stops
it) and returns what its allocators held at their peak: the chunks in
use and the tensors' own bytes (`allocation_trace`). The bytes are
those TensorFlow's allocator holds for tensors
(`tf.config.experimental.get_memory_info`): a GPU's always; the CPU's
only when the server runs with TF_CPU_ALLOCATOR_USE_BFC=true (or under
oneDNN's allocator, TensorFlow's default on CPUs with AVX-512), as
`MemoryWorkers(..., env={'TF_CPU_ALLOCATOR_USE_BFC': 'true'})` starts
them; otherwise reading fails saying so.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from lingvo_pipe.core import cluster
from lingvo_pipe.core import local_workers
from lingvo_pipe.tools import allocation_trace

_MODULE = 'lingvo_pipe.tools.memory_worker'


def ReportPath(address: str) -> str:
  """Where the memory worker at host:port writes its report, on its host."""
  return cluster.ServerFilePath(address, '.memory.json')


def WriteReport(path: str, seq: int,
                traced: Optional[Dict[str, Dict[str, int]]] = None) -> None:
  """Writes {'seq': seq, 'devices': {name: {'current', 'peak'} or
  {'error'}}} for CPU:0 and each GPU (and 'traced': allocation_trace's
  peaks when given), then resets each peak to the current bytes, so that
  the next report's peak is the one since this report. The file is
  replaced atomically.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  names = ['CPU:0'] + [f'GPU:{i}' for i in range(
      len(tf.config.list_physical_devices('GPU')))]
  report = {'seq': seq, 'devices': {}}
  if traced is not None:
    report['traced'] = traced
  for name in names:
    try:
      info = tf.config.experimental.get_memory_info(name)
      tf.config.experimental.reset_memory_stats(name)
    except (ValueError, RuntimeError) as e:
      info = {'error': f'{e}'.strip().splitlines()[0]}
    report['devices'][name] = info
  tmp = f'{path}.{os.getpid()}.tmp'
  with open(tmp, 'w', encoding='utf-8') as f:
    json.dump(report, f)
  os.replace(tmp, path)


def Serve(spec_text: str, task_index: int) -> None:
  """Serves task `task_index` of the spec's 'worker' job (`cluster.Serve`),
  writing a report on each SIGUSR1; never returns."""
  spec = cluster.ParseClusterSpec(spec_text)
  report = ReportPath(spec.task_address('worker', task_index))
  reports = [0]
  tracing: List[tempfile.TemporaryDirectory] = []
  try:
    os.remove(report)  # a killed server's, on this port: its count is not ours
  except OSError:
    pass

  def Report(signum, unused_frame):
    reports[0] += 1
    try:
      traced = None
      if signum == signal.SIGUSR2 and not tracing:
        logdir = tempfile.TemporaryDirectory(prefix='memory_trace_')
        allocation_trace.Start(logdir.name)  # tracing only if it started
        tracing.append(logdir)
      elif signum == signal.SIGUSR1 and tracing:
        with tracing.pop() as logdir:
          traced = allocation_trace.StopAndRead(logdir)
      WriteReport(report, reports[0], traced)
    except Exception as e:  # pylint: disable=broad-except
      # Raised here it would end the server; the reader times out instead
      # and names this log.
      print(f'memory report {report} not written: {e}', file=sys.stderr,
            flush=True)

  signal.signal(signal.SIGUSR1, Report)
  signal.signal(signal.SIGUSR2, Report)
  print(f'Serving worker task {task_index} of {spec.as_dict()}, memory '
        f'reports in {report}.', flush=True)
  cluster.Serve(spec, 'worker', task_index, own_files=[report])


def ReadServerMemory(pids: List[int], addresses: List[str],
                     timeout: float = 30.0) -> List[Dict[str, Any]]:
  """Each server's allocator bytes per device: {'CPU:0': {'current': ...,
  'peak': ...}, ...}; the peak is the one since the previous read (the
  first: since the server started), and a new one starts.

  Signals each server (SIGUSR1; memory workers on this host, as
  MemoryWorkers starts them) and reads its report. WorkersFailed if one
  writes none within `timeout` or keeps no statistics (it names what to
  set).
  """
  return [r['devices'] for r in _Signal(pids, addresses, signal.SIGUSR1,
                                        timeout)]


def TraceStep(pids: List[int], addresses: List[str],
              step: Callable[[], Any], timeout: float = 30.0
              ) -> List[Dict[str, Dict[str, int]]]:
  """Runs `step()` with each server's profiler on; per server, its
  allocators' peaks in that time (allocation_trace.StopAndRead: in_use,
  tensors_at_peak, tensor_peak). Also starts a new peak of
  ReadServerMemory's, as a read does."""
  _Signal(pids, addresses, signal.SIGUSR2, timeout)
  try:
    step()
  finally:  # the profiler off, whatever the step did
    reports = _Signal(pids, addresses, signal.SIGUSR1, timeout)
  for task, r in enumerate(reports):
    if 'traced' not in r:
      raise local_workers.WorkersFailed(
          f'worker task {task} ({addresses[task]}) reported no trace: it '
          'was not tracing (was another TraceStep running?).')
  return [r['traced'] for r in reports]


def _Signal(pids: List[int], addresses: List[str], signum: int,
            timeout: float) -> List[Dict[str, Any]]:
  """Sends `signum` to each server and returns the reports it writes
  in answer (ReadServerMemory's errors)."""
  paths = [ReportPath(a) for a in addresses]
  seqs = [_ReportSeq(path) for path in paths]
  for pid in pids:
    os.kill(pid, signum)
  reports = []
  deadline = time.monotonic() + timeout
  for task, (path, seq) in enumerate(zip(paths, seqs)):
    while _ReportSeq(path) <= seq:
      if time.monotonic() > deadline:
        raise local_workers.WorkersFailed(
            f'worker task {task} ({addresses[task]}, pid {pids[task]}) wrote '
            f'no memory report to {path} within {timeout:g} s; is it a '
            f'memory worker ({_MODULE}), and alive?')
      time.sleep(0.01)
    with open(path, encoding='utf-8') as f:
      report = json.load(f)
    for name, info in report['devices'].items():
      if 'error' in info:
        raise local_workers.WorkersFailed(
            f'worker task {task} keeps no memory statistics for {name} '
            f"({info['error']}); start its server with "
            "TF_CPU_ALLOCATOR_USE_BFC=true (MemoryWorkers: env="
            "{'TF_CPU_ALLOCATOR_USE_BFC': 'true'}).")
    reports.append(report)
  return reports


def _ReportSeq(path: str) -> int:
  """The report's sequence number; 0 if there is none yet."""
  try:
    with open(path, encoding='utf-8') as f:
      return int(json.load(f)['seq'])
  except (OSError, ValueError, KeyError):
    return 0


class MemoryWorkers(local_workers.LocalWorkers):
  """LocalWorkers whose servers are memory workers; a context manager.

    with MemoryWorkers(2, log_dir,
                       env={'TF_CPU_ALLOCATOR_USE_BFC': 'true'}) as workers:
      names = cluster.Connect(cluster.ParseClusterSpec(workers.spec))
      ...
      held = [r['CPU:0']['current'] for r in workers.ReadMemory()]

  Takes LocalWorkers' arguments.
  """

  def ReadMemory(self, timeout: float = 30.0) -> List[Dict[str, Any]]:
    """`ReadServerMemory` of every task."""
    if not self._running:
      raise RuntimeError('Start() the MemoryWorkers before ReadMemory().')
    return ReadServerMemory(self.pids, self.addresses, timeout)

  def TraceStep(self, step: Callable[[], Any], timeout: float = 30.0
                ) -> List[Dict[str, Dict[str, int]]]:
    """`TraceStep` of every task."""
    if not self._running:
      raise RuntimeError('Start() the MemoryWorkers before TraceStep().')
    return TraceStep(self.pids, self.addresses, step, timeout)

  def _ServerCommand(self, task: int) -> List[str]:
    return [sys.executable, '-m', _MODULE, f'--cluster_spec={self.spec}',
            f'--task_index={task}']


def main(argv: Optional[Sequence[str]] = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--cluster_spec', required=True,
                      help="'worker=host:port,host:port'")
  parser.add_argument('--task_index', type=int, required=True)
  args = parser.parse_args(argv)
  Serve(args.cluster_spec, args.task_index)


if __name__ == '__main__':
  main()
