"""TF_CONFIG through the trainer binary, as orchestrators start it.

docs/kubeflow/tfjob.yaml is read as Kubeflow's training operator reads it:
each replica's TF_CONFIG (the operator's cluster of `<job>-<type>-<i>`
services, here loopback ports) and the one command every replica runs
drive one chief and two workers, which train K=2 exactly as the same model
on --cluster_spec; so does a cluster without a chief (worker 0 trains and
serves task 0). A wrong TF_CONFIG is one line before anything starts.
"""

import json
import os
import re
import signal
import subprocess
import sys

from absl.testing import absltest
import yaml

from lingvo_pipe.core import local_workers
from tests import trainer_testlib

_MANIFEST = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), 'docs', 'kubeflow', 'tfjob.yaml')
_STEPS = ('--model_params_override=task.train.max_steps : 20\n'
          'task.train.eval_interval_steps : 0')
_DETERMINISTIC = {'TF_DETERMINISTIC_OPS': '1'}


def _OperatorConfigs(replicas, addresses):
  """{(type, index): TF_CONFIG} as the operator sets them for `replicas`
  ({type: count}, the manifest's), `addresses[type]` its services."""
  cluster = {t: addresses[t][:n] for t, n in replicas.items()}
  return {(t, i): json.dumps({'cluster': cluster,
                              'task': {'type': t, 'index': i},
                              'environment': 'cloud'})
          for t, n in replicas.items() for i in range(n)}


class TrainerTfConfigTest(trainer_testlib.TrainerTestBase):

  def _Loss(self, logdir):
    return trainer_testlib.Scalars(os.path.join(logdir, 'train'))['loss']

  def _RunCluster(self, command, configs, trainer_key):
    """Starts every replica of `configs` but `trainer_key` with its
    TF_CONFIG, then runs `trainer_key`'s; stops the others. The trainer's
    result, and the servers' first lines."""
    servers = {}
    for key, config in configs.items():
      if key != trainer_key:
        servers[key] = subprocess.Popen(
            command, env=self._Env({'TF_CONFIG': config, **_DETERMINISTIC}),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.addCleanup(lambda p=servers[key]: p.poll() is None and p.kill())
    result = subprocess.run(
        command, env=self._Env({'TF_CONFIG': configs[trainer_key],
                                **_DETERMINISTIC}),
        capture_output=True, text=True, timeout=300)
    said = {}
    for key, proc in servers.items():
      proc.send_signal(signal.SIGINT)  # at once (SIGTERM: their grace)
      said[key] = proc.communicate(timeout=30)[0].splitlines()[:1]
    return result, said

  def testTfJobManifestTrainsAsTheClusterSpecDoes(self):
    with open(_MANIFEST) as f:
      manifest = yaml.safe_load(f)
    self.assertEqual(manifest['kind'], 'TFJob')
    specs = manifest['spec']['tfReplicaSpecs']
    replicas = {t.lower(): s['replicas'] for t, s in specs.items()}
    self.assertEqual(replicas, {'chief': 1, 'worker': 2})
    containers = [s['template']['spec']['containers'][0]
                  for s in specs.values()]
    command = containers[0]['command']
    for container in containers:  # one command; TF_CONFIG tells the role
      self.assertEqual(container['command'], command)
      self.assertEqual(container['ports'][0]['name'], 'tfjob-port')
    self.assertEqual(command[:3], ['python', '-m', 'lingvo_pipe.trainer'])
    # The manifest's model needs the manifest's workers.
    model = [a.split('=', 1)[1] for a in command if a.startswith('--model=')]
    check = subprocess.run(
        [sys.executable, '-c', 'from lingvo_pipe import trainer; from '
         'lingvo_pipe.core import base_model; print(base_model.'
         f'NumDevicesNeeded(trainer.LoadParams({model[0]!r}).task))'],
        env=self._Env(), capture_output=True, text=True, timeout=300)
    self.assertEqual(check.stdout.strip(), str(replicas['worker']),
                     check.stderr[-2000:])

    # The reference: the test's model on two servers named by --cluster_spec.
    reference = self.create_tempdir().full_path
    workers = local_workers.LocalWorkers(2, os.path.join(reference, 'w'))
    self.addCleanup(workers.Stop)
    workers.Start()
    result = self._Run(reference, f'--cluster_spec={workers.spec}', _STEPS,
                       env=_DETERMINISTIC)
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    workers.Stop()

    # The manifest's command (the test's model and logdir: the last flag
    # wins), each replica's TF_CONFIG; loopback ports for the services.
    ports = local_workers.FreePorts(3)
    addresses = {'chief': [f'127.0.0.1:{ports[0]}'],
                 'worker': [f'127.0.0.1:{p}' for p in ports[1:]]}
    for with_chief in (True, False):
      logdir = self.create_tempdir().full_path
      run = ([sys.executable] + command[1:] +
             ['--model=lp_user_models.Tiny', f'--logdir={logdir}', _STEPS,
              '--worker_timeout_secs=60'])
      kinds = replicas if with_chief else {'worker': 2}
      configs = _OperatorConfigs(kinds, addresses)
      trainer_key = ('chief', 0) if with_chief else ('worker', 0)
      result, said = self._RunCluster(run, configs, trainer_key)
      self.assertEqual(result.returncode, 0, result.stderr[-3000:])
      self.assertNotIn('Traceback', result.stderr)
      self.assertIn('partition 1: /job:worker/replica:0/task:1/device:CPU:0',
                    result.stdout)
      for (_, index), lines in said.items():
        self.assertRegex(lines[0], rf'^Serving worker task {index} of ')
      self.assertEqual(self._Loss(logdir), self._Loss(reference))
      self.assertEqual(self._Loss(logdir)[-1][0], 20)
      # Nothing left serving.
      for address in addresses['worker']:
        self.assertEqual(trainer_testlib.ProcessesWith(address), [])

  def testAnEvaluatorEvaluatesTheTrainersCheckpoints(self):
    """TFJob leaves the evaluator out of the cluster; it follows the
    checkpoints in the shared logdir on its own devices."""
    logdir = self.create_tempdir().full_path
    trained = self._Run(logdir, _STEPS)
    self.assertEqual(trained.returncode, 0, trained.stderr[-3000:])
    config = json.dumps({'cluster': {'chief': ['127.0.0.1:1'],
                                     'worker': ['127.0.0.1:2']},
                         'task': {'type': 'evaluator', 'index': 0}})
    result = self._Run(logdir, _STEPS, env={'TF_CONFIG': config})
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    self.assertIn('eval dev at step 20', result.stdout)
    self.assertEqual(
        [s for s, _ in trainer_testlib.Scalars(
            os.path.join(logdir, 'eval_dev'))['loss']], [20, 20])

  def testAWrongTfConfigIsOneLineBeforeAnythingStarts(self):
    logdir = self.create_tempdir().full_path
    for config, expected in [
        ('{"cluster": {"worker": ["127.0.0.1:1"]}', 'is not JSON'),
        ('{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": '
         '"worker", "index": 2}}', 'task worker 2 is out of range'),
        ('{"cluster": {"worker": ["127.0.0.1:1"]}}', 'has no "task"')]:
      result = self._Run(logdir, env={'TF_CONFIG': config})
      self.assertEqual(result.returncode, 1, result.stderr[-3000:])
      self.assertNotIn('Traceback', result.stderr)
      lines = result.stderr.strip().splitlines()
      self.assertLen(lines, 1, result.stderr)
      self.assertRegex(lines[0], f'^error: TF_CONFIG .*{re.escape(expected)}')
      self.assertFalse(os.path.exists(os.path.join(logdir, 'params.txt')))
    # With --cluster_spec too, one line says which wins.
    result = self._Run(logdir, '--cluster_spec=worker=127.0.0.1:1,'
                       '127.0.0.1:2', '--worker_timeout_secs=1',
                       env={'TF_CONFIG': 'not read'})
    self.assertEqual(result.returncode, 1)
    self.assertEqual(result.stderr.strip().splitlines()[0],
                     'TF_CONFIG is set and so is --cluster_spec: '
                     '--cluster_spec wins, TF_CONFIG is not read.')


if __name__ == '__main__':
  absltest.main()
