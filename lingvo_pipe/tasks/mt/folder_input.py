"""TranslateFolderInput: a user's own sentence pairs, read by TFDS.

  ROOT/<lang>.<split>.txt    e.g. ROOT/de.train.txt, ROOT/en.train.txt,
                                  ROOT/de.test.txt,  ROOT/en.test.txt

  p = TranslateFolderInput.Params().Set(
      data_dir='/path/to/ROOT', split='train', vocab_file='/tmp/vocab.txt',
      batch_size=32, max_length=32, tokenizer='subword', max_vocab_size=8000)

`tfds.folder_dataset.TranslateFolder(ROOT)` reads every file of ROOT,
named <lang>.<split>.<anything>, one sentence a line (UTF-8), line i of
each language of a split being the same sentence: the features of an
example are its languages. Batches are MTInput's. source_key and
target_key name the languages; left None, they are found from the files:
with exactly two languages, the first in alphabetical order is the source
(de -> en; set them to go the other way). The vocabulary is built from the
vocab_split files of both languages into p.vocab_file, which must be
outside ROOT (TranslateFolder would read it): the trainer sets
<logdir>/vocab.txt.

`CheckFolder` checks ROOT before anything is read, each check cheap and
sure; the first failure is a DataError, one line naming the file and what
to change:
- data_dir is given and is a folder; every entry of ROOT is a file named
  <lang>.<split>.<ext>, one per language and split;
- every file is UTF-8 text with at least one line, and the languages of
  each split have as many lines (TFDS's count: str.splitlines);
- the source and target files of p.split and p.vocab_split exist;
- an input that does not repeat (evaluation) has at least one batch.
The trainer runs it through `FillFromData`, which also fills the languages
left None; building the input runs it again, reading the files again only
if a file's size or time changed since (within a process).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Dict, Tuple

import tensorflow as tf
import tensorflow_datasets as tfds

from lingvo_pipe.core import base_input_generator
from lingvo_pipe.core import hyperparams
from lingvo_pipe.tasks.mt import input_generator

NAME = 'translate_folder'  # p.dataset_name: informational

DataError = base_input_generator.DataError
InputName = base_input_generator.InputName
DataRoot = base_input_generator.DataRoot


@dataclasses.dataclass(frozen=True)
class Folder:
  """What CheckFolder found: {split: {language: (path, lines)}}."""
  splits: Dict[str, Dict[str, Tuple[str, int]]]

  @property
  def languages(self) -> Tuple[str, ...]:
    return tuple(sorted({lang for files in self.splits.values()
                         for lang in files}))


class TranslateFolderInput(input_generator.MTInput):
  """Sentence pairs of a folder of <lang>.<split>.txt (module docstring)."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.dataset_name = NAME
    p.source_key = None
    p.target_key = None
    return p

  @classmethod
  def FillFromData(cls, input_p: hyperparams.Params,
                   model_p: hyperparams.Params) -> None:
    """Checks the folder; fills source_key and target_key left None, from
    the train input's if it has them (so that setting train_input's is
    enough), else from the files. Does nothing without data_dir."""
    if input_p.data_dir is None:
      return
    train = model_p.Get('train_input') if 'train_input' in model_p else None
    if (train is not None and train is not input_p and
        train.Get('cls') is cls and train.data_dir == input_p.data_dir):
      for key in ('source_key', 'target_key'):
        if input_p.Get(key) is None:
          input_p.Set(**{key: train.Get(key)})
    _FillLanguages(input_p)
    CheckFolder(input_p)

  def __init__(self, params: hyperparams.Params) -> None:
    p = params.Copy()
    if p.data_dir is not None:
      _FillLanguages(p)
    super().__init__(p)

  def _CheckParams(self) -> None:
    super()._CheckParams()
    p = self.params
    if p.data_dir is None:
      raise FileNotFoundError(
          f'{InputName(p)}: no folder of sentence pairs given; pass '
          '--data_dir=ROOT (p.data_dir), a folder of ROOT/<lang>.<split>.txt '
          'files.')
    CheckFolder(p)

  def VocabFile(self) -> str:
    p = self.params
    if not p.vocab_file:
      self._Fail('p.vocab_file is None; set a path outside data_dir (the '
                 'trainer sets <logdir>/vocab.txt).')
    return p.vocab_file

  def _LoadSplit(self, split: str, shuffle_files: bool,
                 dataset_name: Any = None) -> tf.data.Dataset:
    """The split as TranslateFolder reads it: dicts {language: text}."""
    del dataset_name  # One folder.
    return self._LoadFromBuilder(tfds.folder_dataset.TranslateFolder(
        os.fspath(self.params.data_dir)), split, shuffle_files)


def CheckFolder(p: hyperparams.Params) -> Folder:
  """Checks p.data_dir for p (module docstring); what it found.

  Raises:
    DataError: the first problem, one line naming the file or folder.
  """
  root, folder = DataRoot(p), _Checked(p)
  source, target = _Languages(p, folder)
  for split in dict.fromkeys((p.split, p.vocab_split)):
    files = folder.splits.get(split, {})
    missing = [lang for lang in (source, target) if lang not in files]
    if missing:
      names = ' or '.join(os.path.join(root, f'{lang}.{split}.txt')
                          for lang in missing)
      present = [files[lang][0] for lang in (source, target) if lang in files]
      aligned = f', aligned line by line with {present[0]}' if present else ''
      them = 'it' if len(missing) == 1 else 'them'
      raise DataError(
          f'{InputName(p)}: no file {names} (split {split!r}, {source} -> '
          f'{target}); add {them}{aligned}, or change p.split.')
  lines = folder.splits[p.split][source][1]
  if not p.repeat and lines < p.batch_size:
    raise DataError(
        f'{InputName(p)}: {folder.splits[p.split][source][0]} has {lines} '
        f'lines, fewer than one batch of {p.batch_size}; add sentence pairs or '
        'lower the batch size (p.batch_size).')
  return folder


def _FillLanguages(p: hyperparams.Params) -> None:
  """Sets p.source_key and p.target_key (if None) as CheckFolder finds
  them."""
  source, target = _Languages(p, _Checked(p))
  p.source_key, p.target_key = source, target


def _Checked(p: hyperparams.Params) -> Folder:
  """_CheckedFolder of p.data_dir, its error naming the input."""
  try:
    return _CheckedFolder(DataRoot(p))
  except DataError as err:
    raise DataError(f'{InputName(p)}: {err}') from None


def _Languages(p: hyperparams.Params, folder: Folder) -> Tuple[str, str]:
  """(source, target): p's, or the folder's two languages in order."""
  source, target = p.source_key, p.target_key
  languages = folder.languages
  others = [lang for lang in languages if lang not in (source, target)]
  if source is None and target is None and len(languages) == 2:
    source, target = languages
  elif source is None and target is not None and len(others) == 1:
    source = others[0]
  elif target is None and source is not None and len(others) == 1:
    target = others[0]
  if source is None or target is None:
    raise DataError(
        f'{InputName(p)}: {p.data_dir} has files of {len(languages)} languages '
        f'({", ".join(languages)}), so source and target are not known; '
        "set p.source_key and p.target_key (e.g. 'de' and 'en').")
  if source == target:
    raise DataError(f'{InputName(p)}: source_key and target_key are both '
                    f'{source!r}; set two languages.')
  return source, target


def _CheckedFolder(root: str) -> Folder:
  """The checks of every file of `root`."""
  if not tf.io.gfile.isdir(root):
    raise DataError(
        f'data_dir {root} is not a folder; pass --data_dir=ROOT '
        '(p.data_dir), a folder of ROOT/<lang>.<split>.txt files.')
  stamps = []
  for name in sorted(tf.io.gfile.listdir(root)):
    path = os.path.join(root, name.rstrip('/'))
    parts = name.rstrip('/').split('.')
    if len(parts) != 3 or not all(parts[:2]) or tf.io.gfile.isdir(path):
      raise DataError(
          f'{path} is not a file named <lang>.<split>.txt; move it out of '
          f'{root} (TFDS\'s TranslateFolder reads every entry there).')
    stat = tf.io.gfile.stat(path)
    stamps.append((path, stat.length, stat.mtime_nsec))
  return _CheckedFiles(root, tuple(stamps))


@functools.lru_cache(maxsize=None)
def _CheckedFiles(root: str, stamps: Tuple[Tuple[str, int, int], ...]
                  ) -> Folder:
  """_CheckedFolder's reading of the files, once per `stamps` (path, size,
  modification time of each) in a process: every build of an input checks
  again, reading the files only when one changed."""
  splits: Dict[str, Dict[str, Tuple[str, int]]] = {}
  for path, _, _ in stamps:
    lang, split, _ = os.path.basename(path).split('.')
    files = splits.setdefault(split, {})
    if lang in files:
      raise DataError(f'{files[lang][0]} and {path} are both language '
                      f'{lang!r} of split {split!r}; keep one.')
    files[lang] = (path, _CountLines(path))
  if not splits:
    raise DataError(f'{root} has no files; add <lang>.<split>.txt files, '
                    f'e.g. {root}/de.train.txt and {root}/en.train.txt.')
  for split, files in sorted(splits.items()):
    (first, n), *rest = sorted(files.values())
    for path, count in rest:
      if count != n:
        raise DataError(
            f'{first} has {n} lines but {path} has {count}; the languages '
            f'of split {split!r} must be aligned line by line.')
  return Folder(splits)


def _CountLines(path: str) -> int:
  """Lines of a UTF-8 file as TranslateFolder counts them; fails on a
  file that is not UTF-8 or has no lines."""
  with tf.io.gfile.GFile(path, 'rb') as f:
    data = f.read()
  try:
    lines = len(data.decode('utf-8').splitlines())
  except UnicodeDecodeError as err:
    raise DataError(f'{path} is not UTF-8 text (byte {err.start}); convert '
                    'it to UTF-8.') from None
  if not lines:
    raise DataError(f'{path} is empty; add its sentences, one a line.')
  return lines
