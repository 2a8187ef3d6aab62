"""Pipelines across machines: TensorFlow's own gRPC servers, no home-made RPC.

Each worker runs a `tf.distribute.Server` (`python -m lingvo_pipe.trainer
--job=server --cluster_spec=... --task_index=i`); the trainer connects to
the cluster, and partition k of every PipeliningLayer that names no devices
runs on worker task k:

  trainer (client) --gRPC--> worker task 0: partition 0 variables and ops
                   --gRPC--> worker task 1: partition 1 ...

TensorFlow's runtime moves the activations between tasks (Send/Recv).

A worker needs at least two inter-op threads for the partitions to overlap:
with one (a server pinned to one core gets one by default) its executor
runs a partition's micro-batches back to back on that thread and the
sends of finished micro-batches wait until the last one is done, so the
workers take turns (docs/DESIGN.md section 15). `StartServer` sees to it.
"""

from __future__ import annotations

import os
from typing import Any, List, Optional

import tensorflow as tf

from lingvo_pipe.core import base_model
from lingvo_pipe.core import devices
from lingvo_pipe.core import pipeline_run

# What TensorFlow reads for its default inter-op thread count.
_INTER_OP_ENV = 'TF_NUM_INTEROP_THREADS'


def ParseClusterSpec(text: str) -> tf.train.ClusterSpec:
  """'worker=host:port,host:port;ps=host:port' -> ClusterSpec."""
  jobs = {}
  for part in text.split(';'):
    part = part.strip()
    if not part:
      continue
    name, sep, addresses = part.partition('=')
    hosts = [a.strip() for a in addresses.split(',') if a.strip()]
    if not sep or not name.strip() or not hosts:
      raise ValueError(
          f'Bad cluster spec part {part!r}; write job=host:port[,host:port]'
          "[;job2=...], e.g. 'worker=localhost:2222,localhost:2223'.")
    jobs[name.strip()] = hosts
  if not jobs:
    raise ValueError('The cluster spec is empty; write e.g. '
                     "'worker=localhost:2222,localhost:2223'.")
  return tf.train.ClusterSpec(jobs)


def StartServer(spec: tf.train.ClusterSpec, job: str,
                task_index: int) -> tf.distribute.Server:
  """Starts this process's server for task `task_index` of `job`."""
  if job not in spec.jobs or task_index >= spec.num_tasks(job):
    raise ValueError(
        f'Task {task_index} of job {job!r} is not in the cluster spec '
        f'{spec.as_dict()}; fix --task_index or --cluster_spec.')
  EnsureInterOpThreads()
  return tf.distribute.Server(spec, job_name=job, task_index=task_index,
                              start=True)


def EnsureInterOpThreads(minimum: int = 2) -> int:
  """Gives this process's TF servers at least `minimum` inter-op threads.

  A worker's executors take their thread count from the client's config,
  where 0 (the default) means the worker's own default: its number of
  cores, so 1 for a server pinned to one core. This sets that default
  (TF_NUM_INTEROP_THREADS, read when the server starts) to `minimum` when
  the process may use fewer cores and the user has not set it. Returns
  the count the server will use by default.
  """
  if os.environ.get(_INTER_OP_ENV):
    return int(os.environ[_INTER_OP_ENV])
  cores = devices.NumCores()
  if cores < minimum:
    os.environ[_INTER_OP_ENV] = str(minimum)
    return minimum
  return cores


def Connect(spec: tf.train.ClusterSpec, job: str = 'worker') -> List[str]:
  """Connects this client; returns one device per task of `job`.

  The device of a task is its first GPU if it has one, else its first CPU.
  """
  if job not in spec.jobs:
    raise ValueError(f'The cluster spec {spec.as_dict()} has no job {job!r}.')
  pipeline_run.ShareCallBodies()  # before connecting: workers get it too
  tf.config.experimental_connect_to_cluster(spec)
  remote = [tf.DeviceSpec.from_string(d.name)
            for d in tf.config.list_logical_devices()]
  found = []
  for task in range(spec.num_tasks(job)):
    mine = [d for d in remote if d.job == job and d.task == task]
    for kind in ('GPU', 'CPU'):
      hits = sorted((d for d in mine if d.device_type == kind),
                    key=lambda d: d.device_index)
      if hits:
        found.append(hits[0].to_string())
        break
    else:
      raise RuntimeError(
          f'Task {task} of job {job!r} shows no devices; is its server '
          'running?')
  return found


def PlacePipelines(params: Any, device_names: List[str],
                   replicas: Optional[int] = None) -> int:
  """Sets `devices` of every pipeline params in the tree that has none.

  Replica r's partition k goes to device r * K + k (`replicas` defaults to
  the task params' train.num_replicas, 1 if none). Returns how many
  pipelines were placed. A pipeline needing more devices than there are
  is an error naming both numbers.
  """
  if replicas is None:
    replicas = base_model.NumReplicas(params)
  placed = 0
  stack = [params]
  while stack:
    value = stack.pop()
    if isinstance(value, (list, tuple)):
      stack.extend(value)
    elif isinstance(value, dict):
      stack.extend(value.values())
    elif hasattr(value, 'IterParams'):
      if 'cell_tpl' in value and 'devices' in value and value.cell_tpl:
        if value.devices is None:
          k = len(value.cell_tpl)
          if k * replicas > len(device_names):
            raise ValueError(
                f'A pipeline has {k} partitions x {replicas} replica(s) = '
                f'{k * replicas} tasks but the cluster has '
                f'{len(device_names)}; add worker tasks or use fewer '
                'partitions or replicas.')
          value.devices = list(device_names[:k * replicas])
          placed += 1
      stack.extend(v for _, v in value.IterParams())
  return placed
