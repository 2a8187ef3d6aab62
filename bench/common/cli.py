"""The command line of a benchmark, run from the repository's root.

Every folder's entry point is `python -m bench.<folder>.run [flags]`. A
folder with several measurements names one first, and its run.py is
`Dispatch` over a table of them:

  python -m bench.scaling.run replicas --rounds=10
    -> bench.scaling.replicas.main(['--rounds=10'])

Each measurement keeps its own flags and --help (`Prog` names it in the
usage line). Child processes a benchmark starts run its modules the same
way (`python -m bench.<folder>.<module>`): they inherit the working
directory and PYTHONPATH through which this process found `bench`.
`Header` is the first line or two of a run's output: the command as
typed, the date and the machine.
"""

import importlib
import os
import shlex
import sys
import time
from typing import Dict, List, Sequence

_chosen: List[str] = []  # the measurement Dispatch runs, if any


def _MainModule() -> str:
  """'bench.scaling.run': the module `python -m` ran."""
  spec = getattr(sys.modules.get('__main__'), '__spec__', None)
  return spec.name if spec else os.path.relpath(sys.argv[0])


def Prog() -> str:
  """'python -m bench.scaling.run replicas': argparse's prog of a
  measurement, as it was started."""
  return ' '.join(['python -m', _MainModule()] + _chosen)


def Text() -> str:
  """This process's command line, e.g. '.venv/bin/python -m
  bench.memory.run table1 --m=8'."""
  return shlex.join([os.path.relpath(sys.executable), '-m', _MainModule()] +
                    sys.argv[1:])


def Header(*more: str) -> str:
  """'$ <command>' and '<date> UTC, nproc N, load L[, more...]'."""
  facts = [f'{time.strftime("%Y-%m-%d %H:%M")} UTC',
           f'nproc {os.cpu_count()}', *more,
           f'load {os.getloadavg()[0]:.2f}']
  return f'$ {Text()}\n' + ', '.join(facts)


def Dispatch(doc: str, measurements: Dict[str, str],
             argv: Sequence[str]) -> None:
  """Runs `main(flags)` of the module that argv[0] names in
  `measurements` (name -> module), with the flags after it.

  -h / --help prints `doc` (the run.py's docstring, which lists the
  measurements); no name, or an unknown one, exits saying which there are.
  """
  if argv and argv[0] in ('-h', '--help'):
    print(doc.strip())
    return
  if not argv:
    sys.exit(f'{doc.strip()}\n\n{Prog()}: name a measurement first.')
  name, flags = argv[0], list(argv[1:])
  if name not in measurements:
    sys.exit(f'{Prog()}: no measurement {name!r}; name one of '
             f'{", ".join(measurements)} first, then its flags.')
  _chosen[:] = [name]
  importlib.import_module(measurements[name]).main(flags)
