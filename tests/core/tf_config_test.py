"""TF_CONFIG to the trainer's job, cluster and task (core/tf_config.py):
every role of the table in its docstring, and one line for each way a
TF_CONFIG can be wrong."""

import json

from absl.testing import absltest

from lingvo_pipe.core import tf_config

_CLUSTER = {'chief': ['c:1'], 'worker': ['w0:2', 'w1:3']}


def _Role(cluster, kind, index=0):
  return tf_config.Read({tf_config.ENV: json.dumps(
      {'cluster': cluster, 'task': {'type': kind, 'index': index},
       'environment': 'cloud'})})


class TfConfigTest(absltest.TestCase):

  def testUnsetOrEmptyIsNone(self):
    self.assertIsNone(tf_config.Read({}))
    self.assertIsNone(tf_config.Read({tf_config.ENV: '  '}))

  def testRoles(self):
    self.assertEqual(_Role(_CLUSTER, 'chief'), tf_config.Role(
        'trainer', 'worker=w0:2,w1:3', 0, False, 'chief'))
    self.assertEqual(_Role({'master': ['m:1'], 'worker': ['w:2']}, 'master'),
                     tf_config.Role('trainer', 'worker=w:2', 0, False,
                                    'master'))
    for index in (0, 1):
      self.assertEqual(_Role(_CLUSTER, 'worker', index), tf_config.Role(
          'server', 'worker=w0:2,w1:3', index, False, f'worker {index}'))
    # No chief: worker 0 trains and serves task 0; the others serve.
    workers = {'worker': ['w0:2', 'w1:3']}
    self.assertEqual(_Role(workers, 'worker', 0), tf_config.Role(
        'trainer', 'worker=w0:2,w1:3', 0, True, 'worker 0 (no chief)'))
    self.assertEqual(_Role(workers, 'worker', 1).job, 'server')
    # An evaluator evaluates on its own devices (TFJob leaves it out of
    # the cluster).
    self.assertEqual(_Role(_CLUSTER, 'evaluator'), tf_config.Role(
        'evaler_dev', '', 0, False, 'evaluator'))

  def testEachWrongTfConfigIsOneLine(self):
    cases = {
        '{"cluster": ': 'is not JSON',
        '[1, 2]': 'is list JSON, not an object',
        '{"task": {"type": "worker", "index": 0}}': 'has no "cluster"',
        '{"cluster": {"worker": ["w:1"]}}': 'has no "task"',
        '{"cluster": {"chief": ["c:1"]}, "task": {"type": "chief"}}':
            'has no "worker" tasks',
        '{"cluster": {"worker": "w:1"}, "task": {"type": "worker"}}':
            "cluster 'worker' is \"w:1\"; give a list",
        '{"cluster": {"worker": ["w:1"]}, "task": {"type": "worker", '
        '"index": 1}}': 'task worker 1 is out of range: its cluster has 1',
        '{"cluster": {"worker": ["w:1"]}, "task": {"type": "worker", '
        '"index": -1}}': 'task index -1 is not a whole number',
        '{"cluster": {"worker": ["w:1"]}, "task": {"type": "chief"}}':
            "task type 'chief' is not in its cluster",
        '{"cluster": {"worker": ["w:1"], "ps": ["p:1"]}, "task": {"type": '
        '"ps"}}': "task type 'ps' has no role here",
    }
    for text, expected in cases.items():
      with self.assertRaises(tf_config.TfConfigError, msg=text) as err:
        tf_config.Read({tf_config.ENV: text})
      self.assertIn(expected, str(err.exception))
      self.assertNotIn('\n', str(err.exception))


if __name__ == '__main__':
  absltest.main()
