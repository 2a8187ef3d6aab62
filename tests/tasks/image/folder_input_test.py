"""ImageFolderInput and the image.folder models on folders the test writes.

The folders hold real JPEG and PNG files (folder_testlib). The trainer's
side (the classes filled in by LoadParams, the errors as the console's last
line) is tests/trainer_folder_test.py.
"""

import os

from absl.testing import absltest
from absl.testing import parameterized
import tensorflow as tf

from lingvo_pipe.core import devices

devices.SplitCpu(4)

from lingvo_pipe.core import base_input_generator  # noqa: E402
from lingvo_pipe.core import base_layer  # noqa: E402
from lingvo_pipe.core import model_registry  # noqa: E402
from lingvo_pipe.tasks.image import folder_input  # noqa: E402
from tests import folder_testlib  # noqa: E402

_KEYS = ('image.folder.AmoebaNetDFolder', 'image.folder.AmoebaNetTinyFolder',
         'image.folder.ResNetFolder', 'image.folder.ResNetTinyFolder')


class ImageFolderInputTest(tf.test.TestCase, parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self._root = self.create_tempdir().full_path
    folder_testlib.WriteImages(self._root, {'train': 5, 'test': 2})

  def _Params(self, **kwargs):
    return folder_input.ImageFolderInput.Params().Set(
        name='train_input', data_dir=self._root, split='train', batch_size=15,
        image_size=16, num_classes=3, seed=1).Set(**kwargs)

  def _Error(self, p, check=folder_input.CheckFolder):
    with self.assertRaises(base_input_generator.DataError) as caught:
      check(p)
    return str(caught.exception)

  def testEveryImageOnceWithItsClass(self):
    for crop in ('random_resized', 'center'):
      inp = self._Params(crop=crop, random_flip=True).Instantiate()
      self.assertEqual(15, inp.NumExamples())
      self.assertEqual(list(folder_testlib.CLASSES),
                       inp.DatasetInfo().features['label'].names)
      batches = list(inp.GetDataset())
      self.assertLen(batches, 1)
      self.assertEqual([15, 16, 16, 3], batches[0].image.shape.as_list())
      self.assertCountEqual([0] * 5 + [1] * 5 + [2] * 5,
                            batches[0].label.numpy().tolist())

  def testTheLabelsAreThePatterns(self):
    # Centre crops of stripes vary along one axis only.
    batch = next(iter(self._Params(crop='center').Instantiate().GetDataset()))
    for image, label in zip(batch.image.numpy(), batch.label.numpy()):
      along_rows = abs(image[1:] - image[:-1]).mean()
      along_cols = abs(image[:, 1:] - image[:, :-1]).mean()
      name = folder_testlib.CLASSES[label]
      if name == 'rows':
        self.assertGreater(along_rows, 3 * along_cols)
      elif name == 'stripes':
        self.assertGreater(along_cols, 3 * along_rows)

  @parameterized.parameters(*_KEYS)
  def testFillFromDataSetsTheClassesOfTheModel(self, key):
    p = model_registry.GetParams(key)
    self.assertIsNone(p.train_input.data_dir)
    folder_input.ImageFolderInput.FillFromData(p.train_input, p)  # no-op
    self.assertEqual(2, p.task.num_classes)
    p.train_input.data_dir = self._root
    folder_input.ImageFolderInput.FillFromData(p.train_input, p)
    self.assertEqual(3, p.task.num_classes)
    self.assertEqual(3, p.train_input.num_classes)
    with base_layer.VariableShapesOnly():
      task = p.task.Set(name='task').Instantiate()
    logits = {path: v.shape.as_list()
              for path, v in task.VariablesByPath().items()
              if path.endswith('logits/w') or path.endswith('logits/b')}
    self.assertNotEmpty(logits)
    self.assertTrue(all(shape[-1] == 3 for shape in logits.values()), logits)

  def testClassesAreCountedOverEverySplit(self):
    os.makedirs(os.path.join(self._root, 'test', 'zebra'))
    with open(os.path.join(self._root, 'test', 'zebra', 'z.png'), 'wb') as f:
      f.write(tf.io.encode_png(folder_testlib.Pattern(0, 0)).numpy())
    self.assertEqual(('checks', 'rows', 'stripes', 'zebra'),
                     folder_input.CheckFolder(self._Params()).classes)

  def testNoFolderGiven(self):
    with self.assertRaisesRegex(
        FileNotFoundError, r"^ImageFolderInput 'train_input': no image "
        r'folder given; pass --data_dir=ROOT \(p.data_dir\), a folder of '
        r'ROOT/train/<class>/\*.jpg\.$'):
      self._Params(data_dir=None).Instantiate()

  def testErrors(self):
    root = self._root
    who = "ImageFolderInput 'train_input': "
    self.assertEqual(
        who + f'data_dir {root}/nope is not a folder; pass --data_dir=ROOT '
        '(p.data_dir), a folder of ROOT/train/<class>/*.jpg.',
        self._Error(self._Params(data_dir=root + '/nope')))
    self.assertEqual(
        who + f"no folder {root}/dev; put the 'dev' images in {root}/dev/"
        '<class>/*.jpg (or .png), or change p.split.',
        self._Error(self._Params(split='dev')))
    self.assertEqual(
        who + f'{root}/test has 6 images, fewer than one batch of 15; add '
        'images or lower the batch size (p.batch_size).',
        self._Error(self._Params(split='test')))
    self._Params(split='test', repeat=True).Instantiate()  # repeats: fine
    lonely = os.path.join(self.create_tempdir().full_path, 'train')
    folder_testlib.WriteImages(os.path.dirname(lonely), {'train': 1},
                               classes=('cats',))
    self.assertEqual(
        who + f"{os.path.dirname(lonely)} has one class, 'cats'; a classifier "
        f'needs two or more: add a folder per class in {lonely}/.',
        self._Error(self._Params(data_dir=os.path.dirname(lonely))))
    os.makedirs(os.path.join(root, 'empty'))
    self.assertEqual(
        who + f"{root}/empty has no class folders; put each class's images in "
        f'a folder of its own, {root}/empty/<class>/*.jpg.',
        self._Error(self._Params(split='empty')))
    stray = os.path.join(root, 'test', 'stray.jpg')
    os.rename(os.path.join(root, 'test', 'rows', '0.jpg'), stray)
    self.assertEqual(
        who + f'{stray} is not in a class folder; move it into {root}/test/'
        '<class>/.', self._Error(self._Params(split='test')))
    os.makedirs(os.path.join(root, 'train', 'zebra'))
    with open(os.path.join(root, 'train', 'zebra', 'notes.txt'), 'w') as f:
      f.write('no images here')
    self.assertEqual(
        who + f'class folder {root}/train/zebra has no .jpg, .jpeg or .png '
        'file (its 1 other entries are not read); add its images or remove '
        'the folder.', self._Error(self._Params()))

  def testUnreadableImages(self):
    bad = os.path.join(self._root, 'train', 'rows', '0.jpg')
    with open(bad, 'rb') as f:
      data = f.read()
    with open(bad, 'wb') as f:
      f.write(b'GIF89a not really')
    self.assertEqual(
        f"ImageFolderInput 'train_input': {bad} is not a JPEG or PNG file "
        "(it starts with b'GIF89a n'); replace or remove it.",
        self._Error(self._Params(check_images='signature')))
    with open(bad, 'wb') as f:
      f.write(data[:-2])  # a JPEG cut short: its signature is fine
    folder_input.CheckFolder(self._Params(check_images='signature'))
    self.assertEqual(
        f"ImageFolderInput 'train_input': {bad} is not a whole JPEG or PNG "
        'image (cut short: no end of image (FF D9) after its scan); replace '
        'or remove it.', self._Error(self._Params()))
    with self.assertRaises(base_input_generator.DataError):
      self._Params().Instantiate()  # building the input checks it too


if __name__ == '__main__':
  absltest.main()
