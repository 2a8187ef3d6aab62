"""Checkpoints that survive SIGKILL at any moment.

TensorFlow writes a checkpoint's data and index files first and only then
rewrites the small `checkpoint` state file, atomically (write to a
temporary file, rename). A process killed mid-save leaves the state file
pointing at the previous, complete checkpoint. On top of that,
`RestoreLatest` falls back to the next older checkpoint if the newest one
cannot be read, so a damaged file costs one save interval, never the run.
"""

from __future__ import annotations

import collections
import os
import re
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from absl import logging
import tensorflow as tf


# The key of the input iterator in a checkpoint.
_INPUT_KEY = 'train_input_position'


def _FirstLine(err: Exception) -> str:
  """The first line of an error's message, or its type's name."""
  return (str(err).strip().splitlines() or [type(err).__name__])[0]


class Checkpointer:
  """Saves and restores a flat {name: variable} dict under `directory`.

  With `dataset`, the Checkpointer owns an iterator over it (`iterator`)
  and each checkpoint also holds the input's position, shuffle buffer and
  prefetched batches included, so a resumed run reads on where the saved
  one stopped. If that iterator cannot be saved (a dataset with Python
  functions or other state TF cannot serialise), checkpoints hold the
  variables only and a warning says so once. A checkpoint without a
  position, or with one the (changed) dataset cannot take, restores the
  variables and starts the input over.
  """

  def __init__(self, directory: str, variables: Dict[str, tf.Variable],
               max_to_keep: int = 5,
               dataset: Optional[tf.data.Dataset] = None):
    if not variables:
      raise ValueError('Checkpointer got no variables to save.')
    self._directory = directory
    self._variables_dict = variables
    self._variables = tf.train.Checkpoint(**variables)
    self._max_to_keep = max_to_keep
    self._dataset = dataset
    self._with_input: Optional[tf.train.Checkpoint] = None
    self.iterator: Optional[Any] = None
    if dataset is not None:
      self._NewIterator()
    self._manager = self._Manager(self._with_input or self._variables)
    # Whether the last RestoreLatest/Restore also restored the input.
    self.restored_input = False

  def _NewIterator(self) -> None:
    self.iterator = iter(self._dataset)
    self._with_input = tf.train.Checkpoint(
        **self._variables_dict, **{_INPUT_KEY: self.iterator})

  def _Manager(self, checkpoint: tf.train.Checkpoint
               ) -> tf.train.CheckpointManager:
    return tf.train.CheckpointManager(
        checkpoint, self._directory, max_to_keep=self._max_to_keep,
        checkpoint_name='ckpt')

  @property
  def directory(self) -> str:
    return self._directory

  def Save(self, step: int) -> str:
    """Writes checkpoint `ckpt-<step>`; returns its path prefix."""
    try:
      path = self._manager.save(checkpoint_number=int(step))
    except (tf.errors.FailedPreconditionError,
            tf.errors.UnimplementedError) as err:
      if self._with_input is None:
        raise
      first = _FirstLine(err)
      logging.warning(
          'The train input cannot be checkpointed (%s); checkpoints hold '
          'the variables only and a resumed run starts the input over.',
          first)
      self._with_input = None
      self._manager = self._Manager(self._variables)
      path = self._manager.save(checkpoint_number=int(step))
    logging.info('Saved checkpoint %s', path)
    return path

  def Paths(self) -> List[str]:
    """Complete checkpoints on disk, newest first."""
    state = tf.train.get_checkpoint_state(self._directory)
    if state is None:
      return []
    paths = list(state.all_model_checkpoint_paths) or [
        state.model_checkpoint_path]
    paths = [p if os.path.isabs(p) else os.path.join(self._directory, p)
             for p in paths]
    return [p for p in reversed(paths) if tf.io.gfile.exists(p + '.index')]

  def RestoreLatest(self) -> Optional[str]:
    """Restores the newest readable checkpoint; None if there is none.

    Raises if checkpoints exist but none can be restored (for example the
    model changed): training from scratch then would hide the problem.
    """
    errors = []
    for path in self.Paths():
      try:
        self.Restore(path)
      except Exception as err:  # pylint: disable=broad-except
        # A damaged file fails in many ways (OpError, IndexError, ...).
        first = _FirstLine(err)
        errors.append(f'{os.path.basename(path)}: {first.rstrip(".")}')
        logging.warning('Checkpoint %s cannot be restored (%s); trying '
                        'an older one.', path, first)
        continue
      logging.info('Restored checkpoint %s', path)
      return path
    if errors:
      raise RuntimeError(
          f'No checkpoint in {self._directory} can be restored ('
          f'{"; ".join(errors)}); use another --logdir, or the model that '
          'wrote them.')
    return None

  def Restore(self, path: str) -> None:
    """Restores one checkpoint; raises if it does not match the model.

    The input position too, if this Checkpointer has an iterator and the
    checkpoint holds one (`restored_input` says which happened). A
    checkpoint written when variable paths held the pipeline's partition
    index ('.../cell_1/...') restores too (`RenamedFromPartitions`).
    """
    self.restored_input = False
    renamed = RenamedFromPartitions(path, self._variables_dict)
    with_input = self._with_input is not None and any(
        name.startswith(_INPUT_KEY + '/')
        for name, _ in tf.train.list_variables(path))
    if with_input:
      try:
        self._Read(path, renamed, with_input=True)
        self.restored_input = True
      except (tf.errors.OpError, AssertionError, ValueError) as err:
        # Most likely the input pipeline changed since the save. The
        # failed restore may have cancelled the iterator: make a new one.
        first = _FirstLine(err)
        logging.warning('The input position in %s cannot be restored (%s); '
                        'the input starts over.', path, first)
        self._NewIterator()
        self._manager = self._Manager(self._with_input)
    if not self.restored_input:
      self._Read(path, renamed, with_input=False)
    if renamed:
      _AssignFrom(path, {n: (self._variables_dict[n], source)
                         for n, source in renamed.items()})
      # A warning, so that the console shows it once per resumed run.
      logging.warning('Checkpoint %s was written with partition indices in '
                      'its variable names (cell_<k>); mapped %d of them to '
                      "this model's names.", path, len(renamed))

  def _Read(self, path: str, renamed: Mapping[str, str],
            with_input: bool) -> None:
    """Restores the variables but `renamed` (and the input) by object."""
    checkpoint = self._with_input if with_input else self._variables
    if renamed:  # the checkpoint lacks these names: leave them out
      objects = {n: v for n, v in self._variables_dict.items()
                 if n not in renamed}
      if with_input:
        objects[_INPUT_KEY] = self.iterator
      checkpoint = tf.train.Checkpoint(**objects)
    status = checkpoint.read(path)
    status.assert_existing_objects_matched()
    # What the checkpoint holds beyond (the input position, its save
    # counter) is not wanted here: no warnings about it at exit.
    status.expect_partial()


def _AssignFrom(path: str,
                sources: Mapping[str, Tuple[tf.Variable, str]]) -> None:
  """Assigns each {name: (variable, checkpoint name)} its saved value."""
  reader = tf.train.load_checkpoint(path)
  names = _CheckpointNames(path)
  for name, (var, source) in sources.items():
    key, shape = names[source]
    if shape != var.shape.as_list():
      raise ValueError(
          f'Checkpoint {path} has {source} of shape {shape} for {name} of '
          f'shape {var.shape.as_list()}; resume with the model that wrote '
          'it.')
    var.assign(tf.convert_to_tensor(reader.get_tensor(key), var.dtype))


def StepOf(path: str) -> int:
  """The step number of a `.../ckpt-<step>` path."""
  return int(path.rsplit('-', 1)[-1])


# The suffix TF's object-based checkpoints give a variable's value.
_VALUE_SUFFIX = '/.ATTRIBUTES/VARIABLE_VALUE'


def _CheckpointNames(path: str) -> Dict[str, Tuple[str, List[int]]]:
  """{variable name: (key in the checkpoint, shape)}.

  Object-based checkpoints (ours) name a variable by its object path with
  TF's escaping undone ('.S' is '/', '..' is '.'), so our checkpoints use
  the names of `Task.VariablesToCheckpoint`; name-based (TF1) checkpoints
  use their keys as they are.
  """
  names = {}
  for key, shape in tf.train.list_variables(path):
    if key.endswith(_VALUE_SUFFIX):
      name = re.sub(r'\.(.)', lambda m: '/' if m.group(1) == 'S'
                    else m.group(1), key[:-len(_VALUE_SUFFIX)])
    elif '.ATTRIBUTES' in key or key.startswith('_CHECKPOINTABLE'):
      continue
    else:
      name = key
    names[name] = (key, list(shape))
  return names


# A path component that PipeliningLayer's cells added to variable names
# before their paths left it out.
_CELL = re.compile(r'cell_\d+')


def _WithoutCells(name: str) -> List[str]:
  """`name` with each nonempty subset of its cell_<k> components removed."""
  parts = name.split('/')
  cells = [i for i, part in enumerate(parts) if _CELL.fullmatch(part)]
  shorter = []
  for mask in range(1, 2 ** len(cells)):
    drop = {i for j, i in enumerate(cells) if mask >> j & 1}
    shorter.append('/'.join(p for i, p in enumerate(parts) if i not in drop))
  return shorter


def _CellFreeNames(saved: Iterable[str]) -> Dict[str, str]:
  """{name without some cell_<k> components: the saved name that gives it}.

  Only where exactly one saved name gives it, and it is not saved itself.
  """
  saved = set(saved)
  found: Dict[str, set] = {}
  for name in saved:
    for short in _WithoutCells(name):
      found.setdefault(short, set()).add(name)
  return {short: min(names) for short, names in found.items()
          if len(names) == 1 and short not in saved}


def PartitionIndexMatches(saved: Iterable[str],
                          wanted: Iterable[str]) -> Dict[str, str]:
  """{wanted name: saved name} for names `saved` has with a cell index.

  For each wanted name not in `saved`: the saved name that gives it by
  removing `cell_<digits>` path components, if exactly one does (and it
  gives no other wanted name). 'task/network/cell_0/stem/w' is what
  'task/network/stem/w' was called before the pipeline's cells left their
  index out of variable paths (gpipe.PipeliningLayer).
  """
  saved, wanted = set(saved), list(wanted)
  aliases = _CellFreeNames(saved.difference(wanted))
  matches = {w: aliases[w] for w in wanted
             if w not in saved and w in aliases}
  uses = collections.Counter(matches.values())
  return {w: source for w, source in matches.items() if uses[source] == 1}


def RenamedFromPartitions(path: str,
                          variables: Mapping[str, Any]) -> Dict[str, str]:
  """{variable name: checkpoint name} where the names differ by cell_<k>.

  Raises (one line) if the checkpoint lacks a variable by either name.
  """
  saved = _CheckpointNames(path)
  renamed = PartitionIndexMatches(saved, variables)
  missing = [n for n in variables if n not in saved and n not in renamed]
  if missing:
    more = f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''
    raise ValueError(
        f'Checkpoint {path} has no {missing[0]}{more}, with or without a '
        'partition index (cell_<k>); resume with the model that wrote it, '
        'or start a new --logdir from it with '
        'task.train.init_from_checkpoint_rules.')
  return renamed


def _CheckRules(rules: Any) -> None:
  fix = ("set task.train.init_from_checkpoint_rules to {checkpoint path: "
         "([(regex, format), ...], [ignore regex, ...])}, e.g. "
         "{'/pretrained/train/ckpt-1000': ([('(.*)', '%s')], "
         "['.*logits.*'])}")
  if not isinstance(rules, Mapping):
    raise ValueError(f'init_from_checkpoint_rules is {rules!r}; {fix}.')
  for path, value in rules.items():
    ok = (isinstance(path, str) and isinstance(value, (list, tuple)) and
          len(value) == 2 and all(
              isinstance(r, (list, tuple)) and len(r) == 2 and
              all(isinstance(x, str) for x in r) for r in value[0]) and
          all(isinstance(x, str) for x in value[1]))
    if not ok:
      raise ValueError(
          f'init_from_checkpoint_rules[{path!r}] is {value!r}; {fix}.')
    for regex in [r for r, _ in value[0]] + list(value[1]):
      try:
        re.compile(regex)
      except re.error as err:
        raise ValueError(
            f'init_from_checkpoint_rules[{path!r}]: {regex!r} is not a '
            f'regular expression ({err}).') from None


def InitFromCheckpointRules(variables: Mapping[str, tf.Variable],
                            rules: Mapping[str, Any]) -> str:
  """Loads variables from other checkpoints by rules; a one-line report.

  `rules` (Lingvo's `init_from_checkpoint_rules`): {checkpoint path:
  ([(regex, format), ...], [ignore regex, ...])}. For each variable name
  (`variables`' keys) that no ignore regex matches, the first regex that
  matches it (re.match) gives the checkpoint's name, `format %
  match.groups()`; the variable takes that value if the checkpoint has it
  with the same shape (or only with a partition index, '.../cell_1/...',
  as checkpoints before the cells left it out of variable paths). Every
  other variable keeps its value. A checkpoint that cannot be read is an
  error, not a silent fresh start.
  """
  _CheckRules(rules)
  loaded: Dict[str, str] = {}
  reasons: Dict[str, str] = {}
  for path, (name_rules, ignores) in rules.items():
    try:
      reader = tf.train.load_checkpoint(path)
      names = _CheckpointNames(path)
      aliases = _CellFreeNames(names)
    except (tf.errors.OpError, ValueError) as err:
      raise ValueError(
          f'init_from_checkpoint_rules: cannot read checkpoint {path!r} '
          f'({_FirstLine(err)}); give the path of a checkpoint prefix '
          '(.../ckpt-N).') from None
    for name, var in variables.items():
      if name in loaded or any(re.match(r, name) for r in ignores):
        continue
      for regex, fmt in name_rules:
        match = re.match(regex, name)
        if not match:
          continue
        try:
          source = fmt % match.groups()
        except (TypeError, ValueError) as err:
          raise ValueError(
              f'init_from_checkpoint_rules[{path!r}]: format {fmt!r} does '
              f'not take the groups {match.groups()} of {regex!r} ({err}).'
          ) from None
        if source not in names:  # a checkpoint with partition indices
          source = aliases.get(source, source)
        if source not in names:
          reasons[name] = f'{source} not in the checkpoint'
        elif names[source][1] != var.shape.as_list():
          reasons[name] = (f'shape {var.shape.as_list()} vs '
                           f'{names[source][1]}')
        else:
          var.assign(tf.cast(reader.get_tensor(names[source][0]), var.dtype))
          loaded[name] = source
          reasons.pop(name, None)
        break
  kept = [f'{n} ({reasons.get(n, "no rule")})'
          for n in variables if n not in loaded]
  return (f'Initialised {len(loaded)} of {len(variables)} variables from '
          f'{", ".join(rules)}; kept their initial values: '
          f'{", ".join(kept) or "none"}.')
