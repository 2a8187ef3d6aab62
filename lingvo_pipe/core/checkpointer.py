"""Checkpoints that survive SIGKILL at any moment.

TensorFlow writes a checkpoint's data and index files first and only then
rewrites the small `checkpoint` state file, atomically (write to a
temporary file, rename). A process killed mid-save leaves the state file
pointing at the previous, complete checkpoint. On top of that,
`RestoreLatest` falls back to the next older checkpoint if the newest one
cannot be read, so a damaged file costs one save interval, never the run.
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional

from absl import logging
import tensorflow as tf


class Checkpointer:
  """Saves and restores a flat {name: variable} dict under `directory`."""

  def __init__(self, directory: str, variables: Dict[str, tf.Variable],
               max_to_keep: int = 5):
    if not variables:
      raise ValueError('Checkpointer got no variables to save.')
    self._directory = directory
    self._checkpoint = tf.train.Checkpoint(**variables)
    self._manager = tf.train.CheckpointManager(
        self._checkpoint, directory, max_to_keep=max_to_keep,
        checkpoint_name='ckpt')

  @property
  def directory(self) -> str:
    return self._directory

  def Save(self, step: int) -> str:
    """Writes checkpoint `ckpt-<step>`; returns its path prefix."""
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
        self._checkpoint.read(path).assert_existing_objects_matched()
      except Exception as err:  # pylint: disable=broad-except
        # A damaged file fails in many ways (OpError, IndexError, ...).
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        errors.append(f'{os.path.basename(path)}: {first}')
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
    """Restores one checkpoint; raises if it does not match the model."""
    self._checkpoint.read(path).assert_existing_objects_matched()


def StepOf(path: str) -> int:
  """The step number of a `.../ckpt-<step>` path."""
  return int(path.rsplit('-', 1)[-1])
