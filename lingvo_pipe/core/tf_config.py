"""TF_CONFIG: the cluster and this task's role, as orchestrators set them.

Kubeflow's TFJob, Vertex AI custom jobs and SageMaker start every replica
with the same command and tell each which it is in the environment:

  TF_CONFIG='{"cluster": {"chief": ["job-chief-0:2222"],
                          "worker": ["job-worker-0:2222", "job-worker-1:2222"]},
              "task": {"type": "worker", "index": 1}}'

`Read()` turns that into what the trainer's flags would say:

  task type          job            runs
  chief (or master)  trainer        the training loop, a client of the
                                    cluster's worker tasks
  worker i           server         worker task i's server (partition i)
  worker 0, no chief trainer        the training loop, and worker task 0's
                                    server in a child process
  evaluator          evaler_dev     the Dev evaluation of the trainer's
                                    checkpoints, on its own devices

The pipelines' devices are the `worker` list, in order; the chief's own
address is not served (the trainer needs none). A TF_CONFIG that is not
JSON, lacks the cluster or the task, names a type it has no role for, or
an index past the cluster's list is a TfConfigError of one line.

This module imports no TensorFlow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
from typing import Any, Iterator, Mapping, Optional

from lingvo_pipe.core import local_workers

ENV = 'TF_CONFIG'
_CHIEFS = ('chief', 'master')  # 'master': TF 1's Estimator name


class TfConfigError(ValueError):
  """TF_CONFIG cannot be used; one line says what to fix."""


@dataclasses.dataclass(frozen=True)
class Role:
  """What TF_CONFIG makes this process."""
  job: str  # the trainer's --job: 'trainer', 'server' or 'evaler_dev'
  cluster_spec: str  # as --cluster_spec: 'worker=host:port,...'; '' local
  task_index: int  # with job 'server': the worker task to serve
  serves_task_0: bool  # the trainer also serves worker task 0 (no chief)
  name: str  # 'chief', 'worker 1', 'evaluator': for messages


def Read(environ: Optional[Mapping[str, str]] = None) -> Optional[Role]:
  """This process's Role from TF_CONFIG; None if it is unset or empty."""
  text = (os.environ if environ is None else environ).get(ENV, '').strip()
  if not text:
    return None
  try:
    config = json.loads(text)
  except ValueError as err:
    raise TfConfigError(f'{ENV} is not JSON ({err}); set it to e.g. '
                        '{"cluster": {"worker": ["host:2222"]}, "task": '
                        '{"type": "worker", "index": 0}} or unset it.'
                        ) from None
  if not isinstance(config, dict):
    raise TfConfigError(f'{ENV} is {type(config).__name__} JSON, not an '
                        'object with "cluster" and "task".')
  cluster = _Cluster(config.get('cluster'))
  task = config.get('task')
  if not isinstance(task, dict) or 'type' not in task:
    raise TfConfigError(f'{ENV} has no "task" with a "type" (it says '
                        f'{json.dumps(task)}); add e.g. "task": {{"type": '
                        '"worker", "index": 0}.')
  kind, index = task['type'], task.get('index', 0)
  if not isinstance(index, int) or isinstance(index, bool) or index < 0:
    raise TfConfigError(f'{ENV} task index {index!r} is not a whole number '
                        '0 or more.')
  workers = 'worker=' + ','.join(cluster['worker'])
  if kind == 'evaluator':
    return Role('evaler_dev', '', 0, False, 'evaluator')
  if kind not in cluster:
    roles = ', '.join(sorted(set(cluster) | {'evaluator'}))
    raise TfConfigError(f'{ENV} task type {kind!r} is not in its cluster '
                        f'(types: {roles}); fix "task" or "cluster".')
  if index >= len(cluster[kind]):
    raise TfConfigError(f'{ENV} task {kind} {index} is out of range: its '
                        f'cluster has {len(cluster[kind])} {kind} task(s).')
  if kind in _CHIEFS:
    return Role('trainer', workers, 0, False, kind)
  if kind != 'worker':
    raise TfConfigError(f'{ENV} task type {kind!r} has no role here: the '
                        'chief trains, workers serve the pipelines\' '
                        'partitions, an evaluator evaluates.')
  if index == 0 and not any(c in cluster for c in _CHIEFS):
    return Role('trainer', workers, 0, True, 'worker 0 (no chief)')
  return Role('server', workers, index, False, f'worker {index}')


def _Cluster(cluster: Any) -> dict:
  """The cluster's {type: [address]}, checked."""
  if not isinstance(cluster, dict) or not cluster:
    raise TfConfigError(f'{ENV} has no "cluster" of task types; add e.g. '
                        '"cluster": {"worker": ["host:2222"]}.')
  for kind, addresses in cluster.items():
    if (not isinstance(addresses, list) or not addresses or
        not all(isinstance(a, str) and ':' in a for a in addresses)):
      raise TfConfigError(f'{ENV} cluster {kind!r} is {json.dumps(addresses)}'
                          '; give a list of "host:port" strings.')
  if 'worker' not in cluster:
    raise TfConfigError(f'{ENV} cluster has no "worker" tasks (it has '
                        f'{", ".join(sorted(cluster))}); the pipelines run '
                        'on worker tasks.')
  return cluster


@contextlib.contextmanager
def ServingTaskZero(cluster_spec: str, log_path: str) -> Iterator[None]:
  """Within: worker task 0's server runs in a child process (the trainer
  of a cluster without a chief), logging to `log_path`; stopped on the way
  out, and by Linux if this process is killed (local_workers)."""
  env = {k: v for k, v in os.environ.items() if k != ENV}
  os.makedirs(os.path.dirname(log_path) or '.', exist_ok=True)
  with open(log_path, 'a', encoding='utf-8') as log:
    child = subprocess.Popen(
        [sys.executable, '-m', 'lingvo_pipe.trainer', '--job=server',
         f'--cluster_spec={cluster_spec}', '--task_index=0'],
        env=env, stdin=subprocess.DEVNULL, stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=local_workers.DieWithParent())
  try:
    yield
  finally:
    # SIGINT: at once (SIGTERM would give it its grace period).
    local_workers.Terminate([child], signal.SIGINT)
