"""Process helpers for the benchmarks (Linux): memory from /proc, ports.

`pid` is a process id or 'self'. VmRSS is the resident set now, VmHWM its
high-water mark; `ResetPeak` sets the mark back to the current RSS.
`FreePort` is a TCP port on 127.0.0.1 that was free a moment ago, for a
server subprocess.
"""

import socket
from typing import Callable, List, Sequence, Tuple, Union

Pid = Union[int, str]


def StatusKiB(field: str, pid: Pid = 'self') -> int:
  """A field of /proc/PID/status in KiB, e.g. 'VmRSS' or 'VmHWM'."""
  with open(f'/proc/{pid}/status') as f:
    for line in f:
      if line.startswith(field + ':'):
        return int(line.split()[1])
  raise RuntimeError(f'/proc/{pid}/status has no {field}.')


def ResetPeak(pid: Pid = 'self') -> None:
  """Sets the high-water mark (VmHWM, ru_maxrss) to the current RSS."""
  with open(f'/proc/{pid}/clear_refs', 'w') as f:
    f.write('5')


def PeakDuring(pids: Sequence[Pid],
               run: Callable[[], object]) -> Tuple[List[int], List[int]]:
  """(RSS before, high-water mark during `run()`) of each pid, in KiB.

  Each mark is reset to the current RSS just before `run()`, so the peak
  is the run's own.
  """
  before = [StatusKiB('VmRSS', pid) for pid in pids]
  for pid in pids:
    ResetPeak(pid)
  run()
  return before, [StatusKiB('VmHWM', pid) for pid in pids]


def FreePort() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]
