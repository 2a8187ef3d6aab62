"""The README's commands and code run as written.

Every command in the README's shell blocks (fences without a language) is
checked: its flags parse as the trainer's, its model is registered and its
params overrides apply. The quick ones then run: the trainer on the
built-in synthetic models, the folder models on folders made here (for
/path/to/images and /path/to/pairs), the jobs that follow checkpoints
(capped at 20 steps by one more override line, which wins over the
command's own; logdirs under /tmp/lingvo_pipe/ go to a temporary
directory), and the planner. The
Python blocks run too: the pipelined layer, and the model of one's own
file, trained for a few steps.
"""

import copy
import os
import re
import shlex
import subprocess
import sys
import tempfile
import textwrap

from absl import flags
from absl.testing import absltest

from lingvo_pipe import trainer
from lingvo_pipe.core import model_registry
from tests import folder_testlib

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CAP = 'task.train.max_steps : 20'
# Commands run by CI or tools/test.sh itself, not by this test.
_SUITE = ('bash tools/setup.sh', 'bash tools/test.sh')


def _Blocks(language):
  """The README's fenced blocks tagged `language` ('' for untagged)."""
  with open(os.path.join(_ROOT, 'README.md'), encoding='utf-8') as f:
    lines = f.read().splitlines(keepends=True)
  blocks, tag, body = [], None, []
  for line in lines:
    if not line.startswith('```'):
      body.append(line)
    elif tag is None:
      tag, body = line[3:].strip(), []
    else:
      if tag == language:
        blocks.append(''.join(body))
      tag = None
  return blocks


def _Commands():
  """Each shell command of the README as an argv list (&& splits)."""
  commands = []
  for block in _Blocks(''):
    for line in block.replace('\\\n', ' ').splitlines():
      words = shlex.split(line, comments=True)
      while words:
        end = words.index('&&') if '&&' in words else len(words)
        commands.append(words[:end])
        words = words[end + 1:]
  return commands


def _Module(argv):
  """The module a `python -m` command runs, and its arguments."""
  if argv[:2] == ['taskset', '-c']:
    argv = argv[3:]
  if len(argv) > 2 and argv[0].endswith('python') and argv[1] == '-m':
    return argv[2], argv[3:]
  return None, argv


class ReadmeTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls._commands = _Commands()
    cls._tmp = tempfile.mkdtemp(dir=absltest.TEST_TMPDIR.value)
    # The data of the "your own data" commands.
    folder_testlib.WriteImages(os.path.join(cls._tmp, 'images'),
                               {'train': 4, 'test': 6})
    folder_testlib.WritePairs(os.path.join(cls._tmp, 'pairs'),
                              {'train': 40, 'test': 16})

  def _Local(self, args):
    """args with /tmp/lingvo_pipe/ and DIR under the test's directory."""
    where = os.path.join(self._tmp, 'runs')
    return [a.replace('/tmp/lingvo_pipe', where).replace(
        '=DIR', f'={where}/dir').replace('/path/to', self._tmp)
            for a in args]

  def _Env(self, extra_path=''):
    path = [p for p in (extra_path, _ROOT, os.environ.get('PYTHONPATH')) if p]
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3',
                PYTHONPATH=os.pathsep.join(path))

  def _Parse(self, args):
    values = copy.deepcopy(flags.FLAGS)
    values(['trainer'] + args)  # raises on an unknown flag or bad value
    return values

  def testEveryCommandIsKnown(self):
    modules = set()
    for argv in self._commands:
      with self.subTest(' '.join(argv)):
        if ' '.join(argv) in _SUITE:
          continue
        module, args = _Module(argv)
        self.assertIsNotNone(module, 'not a python -m command')
        modules.add(module)
        if module == 'lingvo_pipe.trainer':
          values = self._Parse(args)
          if values.model:
            trainer.LoadParams(values.model, values.model_params_override)
        else:
          self.assertEqual(module, 'lingvo_pipe.tools.plan')
          model = re.search(r'--model=(\S+)', ' '.join(args)).group(1)
          model_registry.GetClass(model)
    self.assertEqual(modules, {'lingvo_pipe.trainer',
                               'lingvo_pipe.tools.plan'})

  def _Run(self, module, args, extra_path=''):
    result = subprocess.run(
        [sys.executable, '-m', module] + self._Local(args), cwd=_ROOT,
        env=self._Env(extra_path), capture_output=True, text=True,
        timeout=600)
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    return result

  def testQuickCommandsRun(self):
    ran = 0
    for argv in self._commands:
      module, args = _Module(argv)
      if module == 'lingvo_pipe.tools.plan':
        out = self._Run(module, args).stdout
        self.assertIn('Predicted step:', out)
        ran += 1
        continue
      if module != 'lingvo_pipe.trainer':
        continue
      values = self._Parse(args)
      tiny = ('.synthetic.' in (values.model or '') or
              values.model in ('image.folder.ResNetTinyFolder',
                               'mt.folder.TransformerTinyFolder'))
      if (not tiny or values.run_locally == 'processes' or
          values.cluster_spec):
        continue
      with self.subTest(' '.join(argv)):
        override = values.model_params_override
        if 'max_steps' not in override:  # followers stop there too
          cap = _CAP + ('\ntask.train.eval_steps : 1' if values.data_dir
                        else '')
          args = [a for a in args
                  if not a.startswith('--model_params_override=')]
          args.append(f'--model_params_override={override}\n{cap}'
                      if override else f'--model_params_override={cap}')
        out = self._Run(module, args).stdout
        if values.job == 'trainer':
          self.assertRegex(out, r'step \d+/\d+ ')
        ran += 1
    # The default, its evaler, a short run, one's own images and pairs,
    # translation and its decoder, 1F1B, the planner.
    self.assertGreaterEqual(ran, 9)

  def testThePipelinedLayerRuns(self):
    (code,) = [b for b in _Blocks('python') if 'PipeliningLayer' in b]
    code += '\nprint(len(grads), all(g is not None for g in grads))\n'
    result = subprocess.run([sys.executable, '-c', code], cwd=_ROOT,
                            env=self._Env(), capture_output=True, text=True,
                            timeout=300)
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    count, every = result.stdout.split()
    self.assertGreater(int(count), 8)
    self.assertEqual(every, 'True')

  def testTheModelOfOnesOwnTrains(self):
    (code,) = [b for b in _Blocks('python') if 'RegisterSingleTaskModel' in b]
    folder = os.path.join(self._tmp, 'own')
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, 'my_models.py'), 'w') as f:
      f.write(textwrap.dedent(code))
    out = self._Run('lingvo_pipe.trainer', [
        '--model=my_models.WideResNet', f'--logdir={folder}/run',
        f'--model_params_override={_CAP}'], extra_path=folder).stdout
    self.assertIn("'task/network': K=4 partitions, M=8", out)
    self.assertIn('step 20/20', out)


if __name__ == '__main__':
  absltest.main()
