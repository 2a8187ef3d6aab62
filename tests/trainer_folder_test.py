"""The trainer binary on a user's own folders, as a user runs it.

Each run is `python -m lingvo_pipe.trainer --model=<image.folder.* or
mt.folder.*> --data_dir=<a folder the test writes>`: real JPEG and PNG
files, real sentence pairs (folder_testlib). The registered tiny models
train a few steps and evaluate (ResNetTinyFolder: image.folder's other
models differ in the network only, built with the folder's classes in
tests/tasks/image/folder_input_test.py), with the classes counted from
the folder and the vocabulary built into the logdir; a broken folder
stops the run before the model is built, its error the console's last
line. The runs start in setUpClass, two at a time.
"""

import concurrent.futures
import glob
import os
import shutil
import subprocess
import sys

from absl.testing import absltest

from tests import folder_testlib

_IMAGES = 'image.folder.ResNetTinyFolder'
_PAIRS = 'mt.folder.TransformerTinyFolder'
_SHORT = ('task.train.max_steps : 3\ntask.train.eval_steps : 1\n'
          'task.train.eval_interval_steps : 0')


def _Folders(root):
  """{name: (model, data_dir, extra flags)} of every run."""
  images = os.path.join(root, 'images')
  folder_testlib.WriteImages(images, {'train': 4, 'test': 6})
  pairs = os.path.join(root, 'pairs')
  folder_testlib.WritePairs(pairs, {'train': 40, 'test': 16})
  runs = {
      'images': (_IMAGES, images, [f'--model_params_override={_SHORT}']),
      'pairs': (_PAIRS, pairs, [f'--model_params_override={_SHORT}']),
      'no_data_dir': (_IMAGES, os.path.join(root, 'nowhere'), []),
  }

  def Broken(name, model, source, change):
    path = os.path.join(root, name)
    shutil.copytree(source, path)
    change(path)
    runs[name] = (model, path, [])

  Broken('no_test_split', _IMAGES, images,
         lambda path: shutil.rmtree(os.path.join(path, 'test')))
  Broken('no_classes', _IMAGES, images, lambda path: [
      shutil.rmtree(os.path.join(path, 'train', c))
      for c in folder_testlib.CLASSES])
  Broken('empty_class', _IMAGES, images,
         lambda path: os.makedirs(os.path.join(path, 'train', 'zebra')))
  Broken('unreadable', _IMAGES, images, lambda path: _Cut(
      os.path.join(path, 'test', 'rows', '0.jpg'), -2))
  Broken('misaligned', _PAIRS, pairs, lambda path: _Cut(
      os.path.join(path, 'en.train.txt'), 20 * 7))
  Broken('no_test_file', _PAIRS, pairs,
         lambda path: os.remove(os.path.join(path, 'de.test.txt')))
  return runs


def _Cut(path, end):
  """Keeps the file's bytes [:end]."""
  with open(path, 'rb') as f:
    data = f.read()
  with open(path, 'wb') as f:
    f.write(data[:end])


def _Run(model, data_dir, logdir, extra):
  command = [sys.executable, '-m', 'lingvo_pipe.trainer', f'--model={model}',
             f'--data_dir={data_dir}', f'--logdir={logdir}',
             '--run_locally=cpu', *extra]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
  env['PYTHONPATH'] = os.pathsep.join([os.getcwd(),
                                       env.get('PYTHONPATH', '')])
  return subprocess.run(command, env=env, capture_output=True, text=True,
                        timeout=300)


class TrainerFolderTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls._root = os.path.join(absltest.TEST_TMPDIR.value, 'folders')
    shutil.rmtree(cls._root, ignore_errors=True)
    runs = _Folders(os.path.join(cls._root, 'data'))
    cls._logdirs = {name: os.path.join(cls._root, 'logs', name)
                    for name in runs}
    cls._data = {name: data_dir for name, (_, data_dir, _) in runs.items()}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
      futures = {name: pool.submit(_Run, model, data_dir,
                                   cls._logdirs[name], extra)
                 for name, (model, data_dir, extra) in runs.items()}
      cls._results = {name: f.result() for name, f in futures.items()}

  def _Trained(self, name):
    result = self._results[name]
    self.assertEqual(0, result.returncode, result.stderr[-3000:])
    self.assertIn('step 3/3', result.stdout)
    self.assertTrue(os.path.exists(os.path.join(self._logdirs[name], 'train',
                                                'ckpt-3.index')))
    with open(os.path.join(self._logdirs[name], 'params.txt')) as f:
      return f.read()

  def testImagesTrainWithTheFoldersClasses(self):
    params = self._Trained('images')
    for line in ('task.num_classes : 3', 'train_input.num_classes : 3',
                 'dev_input.num_classes : 3',
                 'task.network.cell_tpl[1].sub[3].output_dim : 3'):
      self.assertIn(line + '\n', params)
    self.assertRegex(self._results['images'].stdout,
                     r'eval dev at step 3: accuracy [0-9.]+  loss')

  def testPairsTrainWithTheFoundLanguagesAndVocabulary(self):
    params = self._Trained('pairs')
    self.assertIn("train_input.source_key : 'de'\n", params)
    self.assertIn("dev_input.target_key : 'en'\n", params)
    self.assertTrue(os.path.exists(os.path.join(self._logdirs['pairs'],
                                                'vocab.txt')))
    self.assertEqual(['de.test.txt', 'de.train.txt', 'en.test.txt',
                      'en.train.txt'], sorted(os.listdir(self._data['pairs'])))
    self.assertRegex(self._results['pairs'].stdout,
                     r'eval dev at step 3: .*token_accuracy [0-9.]+')

  def _Stopped(self, name):
    """The last line of stderr, once the run is seen to have stopped before
    building anything."""
    result = self._results[name]
    self.assertEqual(1, result.returncode, result.stderr[-3000:])
    self.assertNotIn('Traceback', result.stderr)
    self.assertNotIn('Model params:', result.stdout)  # nothing was built
    self.assertNotIn('step ', result.stdout)
    self.assertEqual([], glob.glob(os.path.join(self._logdirs[name], 'train',
                                                '*')))
    return result.stderr.strip().splitlines()[-1]

  def testErrorsBeforeTraining(self):
    who = "error: ImageFolderInput 'train_input': "
    data = self._data
    self.assertEqual(who + (
        f"data_dir {data['no_data_dir']} is not a folder; pass "
        '--data_dir=ROOT (p.data_dir), a folder of ROOT/train/<class>/*.jpg.'
    ), self._Stopped('no_data_dir'))
    test = os.path.join(data['no_test_split'], 'test')
    self.assertEqual(
        "error: ImageFolderInput 'test_input': no folder "
        f"{test}; put the 'test' images in {test}/<class>/*.jpg (or .png), "
        'or change p.split.', self._Stopped('no_test_split'))
    train = os.path.join(data['no_classes'], 'train')
    self.assertEqual(who + (
        f"{train} has no class folders; put each class's images in a folder "
        f'of its own, {train}/<class>/*.jpg.'), self._Stopped('no_classes'))
    self.assertEqual(who + (
        f"class folder {data['empty_class']}/train/zebra has no .jpg, .jpeg "
        'or .png file; add its images or remove the folder.'
    ), self._Stopped('empty_class'))
    bad = os.path.join(data['unreadable'], 'test', 'rows', '0.jpg')
    self.assertEqual(
        f"error: ImageFolderInput 'test_input': {bad} is not a whole JPEG or "
        'PNG image (cut short: no end of image (FF D9) after its scan); '
        'replace or remove it.', self._Stopped('unreadable'))
    pairs = data['misaligned']
    with open(os.path.join(pairs, 'en.train.txt')) as f:
      lines = len(f.read().splitlines())
    self.assertEqual(
        f"error: TranslateFolderInput 'train': {pairs}/de.train.txt has 40 "
        f'lines but {pairs}/en.train.txt has {lines}; the languages of split '
        "'train' must be aligned line by line.", self._Stopped('misaligned'))
    pairs = data['no_test_file']
    self.assertEqual(
        f"error: TranslateFolderInput 'test': no file {pairs}/de.test.txt "
        "(split 'test', de -> en); add it, aligned line by line with "
        f'{pairs}/en.test.txt, or change p.split.',
        self._Stopped('no_test_file'))

if __name__ == '__main__':
  absltest.main()
