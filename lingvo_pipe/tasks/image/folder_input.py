"""ImageFolderInput: a user's own images, read by TFDS's ImageFolder.

  ROOT/train/<class>/*.jpg|*.jpeg|*.png
  ROOT/test/<class>/...

  p = ImageFolderInput.Params().Set(data_dir='/path/to/ROOT', split='train',
                                    batch_size=32, num_classes=3, ...)

`tfds.folder_dataset.ImageFolder(ROOT)` reads the files as they are (no
preparation): the classes are the class folders of every split of ROOT,
sorted by name (label i is the i-th name), and it decodes each image to 3
channels (grey and RGBA images too). Preprocessing is
ImageClassificationInput's (crops, flip, normalisation).

`CheckFolder` checks a split before anything is read, each check cheap and
sure; the first failure is a DataError, one line naming the folder or
file and what to change:
- data_dir is given and is a folder, ROOT/<split> is a folder;
- the split has class folders, ROOT two classes or more, and each class
  folder of the split holds at least one .jpg, .jpeg or .png file
  (ImageFolder reads only those, and counts an empty folder as a class);
  no image lies in ROOT/<split> outside a class folder (it would be
  skipped);
- every image is a whole JPEG or PNG file (p.check_images='whole', the
  default: image_files.py reads each file without decoding it, so no
  TensorFlow op runs before the trainer sets up its devices: markers up
  to the scan and an end for a JPEG, every chunk's CRC and the inflated
  data for a PNG), or only starts with a JPEG or PNG signature
  ('signature': 8 bytes read per file);
- an input that does not repeat (evaluation) has at least one batch.
The trainer runs it through `FillFromData`, which also sets num_classes
of the input and the task (SetNumClasses) from the folder; building the
input runs it again, reading the images again only if a file's size or
time changed since (within a process).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Dict, List, Tuple

import tensorflow as tf
import tensorflow_datasets as tfds

from lingvo_pipe.core import base_input_generator
from lingvo_pipe.core import hyperparams
from lingvo_pipe.tasks.image import image_files
from lingvo_pipe.tasks.image import input_generator

NAME = 'image_folder'  # p.dataset_name: informational, TFDS is not asked
EXTENSIONS = ('.jpg', '.jpeg', '.png')  # what ImageFolder reads
CHECKS = ('whole', 'signature')
_SIGNATURES = (image_files.JPEG_SIGNATURE, image_files.PNG_SIGNATURE)

DataError = base_input_generator.DataError
InputName = base_input_generator.InputName
DataRoot = base_input_generator.DataRoot


@dataclasses.dataclass(frozen=True)
class Folder:
  """What CheckFolder found: every class of ROOT, this split's images."""
  classes: Tuple[str, ...]
  num_images: int


class ImageFolderInput(input_generator.ImageClassificationInput):
  """Images of a folder ROOT/<split>/<class>/ (module docstring)."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.dataset_name = NAME
    p.num_classes = 2
    p.Define('check_images', 'whole',
             f'One of {CHECKS}: what is checked of every image before '
             'training (module docstring).')
    return p

  @classmethod
  def FillFromData(cls, input_p: hyperparams.Params,
                   model_p: hyperparams.Params) -> None:
    """Checks the folder; sets num_classes of the input and of the task.

    Does nothing without data_dir: building the input then says to set it.
    """
    if input_p.data_dir is None:
      return
    n = len(CheckFolder(input_p).classes)
    input_p.num_classes = n
    SetNumClasses(model_p.task, n)

  def _CheckParams(self) -> None:
    super()._CheckParams()
    p = self.params
    if p.check_images not in CHECKS:
      self._Fail(f'p.check_images is {p.check_images!r}; use one of '
                 f'{CHECKS}.')
    if p.data_dir is None:
      raise FileNotFoundError(
          f'{InputName(p)}: no image folder given; pass --data_dir=ROOT '
          f'(p.data_dir), a folder of ROOT/{p.split}/<class>/*.jpg.')
    CheckFolder(p)

  def _LoadSplit(self, split: str, shuffle_files: bool,
                 dataset_name: Any = None) -> tf.data.Dataset:
    """The split as ImageFolder reads it: dicts of image, label."""
    del dataset_name  # One folder.
    return self._LoadFromBuilder(tfds.folder_dataset.ImageFolder(
        os.fspath(self.params.data_dir)), split, shuffle_files)


def SetNumClasses(task_p: hyperparams.Params, n: int) -> None:
  """Sets an image classifier's classes: task.num_classes, and in its
  network every layer's num_classes (AmoebaNet's heads) and the output_dim
  of every layer named 'logits' (the ResNets' last layer)."""
  task_p.num_classes = n

  def Visit(value: Any) -> None:
    if isinstance(value, hyperparams.Params):
      if 'num_classes' in value:
        value.num_classes = n
      if 'output_dim' in value and value.Get('name') == 'logits':
        value.output_dim = n
      for _, child in value.IterParams():
        Visit(child)
    elif isinstance(value, (list, tuple)):
      for child in value:
        Visit(child)

  Visit(task_p.network)


def CheckFolder(p: hyperparams.Params) -> Folder:
  """Checks p.data_dir's split p.split (module docstring); what it found.

  Raises:
    DataError: the first problem, one line naming the file or folder.
  """
  root = DataRoot(p)
  try:
    folder = _CheckedSplit(root, p.split, p.check_images)
  except DataError as err:
    raise DataError(f'{InputName(p)}: {err}') from None
  if not p.repeat and folder.num_images < p.batch_size:
    raise DataError(
        f'{InputName(p)}: {os.path.join(root, p.split)} has '
        f'{folder.num_images} images, fewer than one batch of '
        f'{p.batch_size}; add images or lower the batch size '
        '(p.batch_size).')
  return folder


def _CheckedSplit(root: str, split: str, check: str) -> Folder:
  """CheckFolder's work."""
  if not tf.io.gfile.isdir(root):
    raise DataError(f'data_dir {root} is not a folder; pass --data_dir=ROOT '
                    f'(p.data_dir), a folder of ROOT/{split}/<class>/*.jpg.')
  split_dir = os.path.join(root, split)
  if not tf.io.gfile.isdir(split_dir):
    raise DataError(f'no folder {split_dir}; put the {split!r} images in '
                    f'{split_dir}/<class>/*.jpg (or .png), or change p.split.')
  images = _ImagesByClass(split_dir)
  if not images:
    raise DataError(f"{split_dir} has no class folders; put each class's "
                    f'images in a folder of its own, {split_dir}/<class>/'
                    '*.jpg.')
  paths = [path for class_paths in images.values() for path in class_paths]
  stamps = tuple((path, stat.length, stat.mtime_nsec) for path, stat in
                 ((path, tf.io.gfile.stat(path)) for path in paths))
  _CheckImages(stamps, check)
  classes = set()  # ImageFolder's: the class folders of every split
  for name in _Folders(root):
    classes.update(_Folders(os.path.join(root, name)))
  if len(classes) < 2:
    raise DataError(f'{root} has one class, {classes.pop()!r}; a classifier '
                    f'needs two or more: add a folder per class in '
                    f'{split_dir}/.')
  return Folder(tuple(sorted(classes)), len(paths))


def _Folders(path: str) -> List[str]:
  """The names of the folders in `path` (as ImageFolder lists them)."""
  return sorted(f for f in tf.io.gfile.listdir(path)
                if tf.io.gfile.isdir(os.path.join(path, f)))


def _IsImage(name: str) -> bool:
  return name.lower().endswith(EXTENSIONS)


def _ImagesByClass(split_dir: str) -> Dict[str, List[str]]:
  """{class: paths of its images}; fails on an empty class folder or an
  image outside the class folders."""
  entries = sorted(tf.io.gfile.listdir(split_dir))
  classes = _Folders(split_dir)
  for name in entries:
    if name not in classes and _IsImage(name):
      raise DataError(f'{os.path.join(split_dir, name)} is not in a class '
                      f'folder; move it into {split_dir}/<class>/.')
  images = {}
  for name in classes:
    class_dir = os.path.join(split_dir, name)
    files = sorted(tf.io.gfile.listdir(class_dir))
    images[name] = [os.path.join(class_dir, f) for f in files if _IsImage(f)]
    if not images[name]:
      others = (f' (its {len(files)} other entries are not read)' if files
                else '')
      raise DataError(f'class folder {class_dir} has no .jpg, .jpeg or .png '
                      f'file{others}; add its images or remove the folder.')
  return images


@functools.lru_cache(maxsize=None)
def _CheckImages(stamps: Tuple[Tuple[str, int, int], ...],
                 check: str) -> None:
  """Fails on the first image that is not a whole JPEG or PNG file
  (image_files.py), or ('signature') does not start as one. Once per
  `stamps` (path, size, modification time of every file) and mode in a
  process: every build of an input checks again, reading the files only
  when one changed."""
  for path, _, _ in stamps:
    with tf.io.gfile.GFile(path, 'rb') as f:
      data = f.read(8) if check == 'signature' else f.read()
    if check == 'signature':
      if not data.startswith(_SIGNATURES):
        raise DataError(f'{path} is not a JPEG or PNG file (it starts '
                        f'with {data!r}); replace or remove it.')
      continue
    problem = image_files.Problem(data)
    if problem:
      raise DataError(f'{path} is not a whole JPEG or PNG image '
                      f'({problem}); replace or remove it.')
