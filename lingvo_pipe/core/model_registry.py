"""Registered models: `--model=image.cifar10.ResNetGPipe` to params.

A model is a params class with `Task()` (task params) and `Train()`,
`Dev()`, `Test()` (input params), decorated with
`@model_registry.RegisterSingleTaskModel`:

  # params/image/cifar10.py
  @model_registry.RegisterSingleTaskModel
  class ResNetGPipe:
    def Train(self): ...
    def Task(self): ...

Its key is its module path below the `params` package plus the class name
(`image.cifar10.ResNetGPipe`); a class in any other module is keyed by its
full module path (`my_pkg.my_models.MyParams`). `GetParams(key)` imports
what it needs: keys below `params` are found by importing `params.<...>`,
any other key by importing its module, so a user's own file works as long
as it is importable (on PYTHONPATH or in the current directory).
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from typing import Any, Dict, List, Type

from lingvo_pipe.core import hyperparams

_PARAMS_PACKAGE = 'params'
_REGISTRY: Dict[str, Type[Any]] = {}
_DATASETS = ('Train', 'Dev', 'Test')


def _Key(cls: Type[Any]) -> str:
  module = cls.__module__
  prefix = _PARAMS_PACKAGE + '.'
  if module.startswith(prefix):
    module = module[len(prefix):]
  return f'{module}.{cls.__name__}'


def RegisterSingleTaskModel(cls: Type[Any]) -> Type[Any]:
  """Class decorator: registers a params class under its module path."""
  key = _Key(cls)
  for method in ('Task', 'Train'):
    if not callable(getattr(cls, method, None)):
      raise TypeError(
          f"Model '{key}' has no {method}() method; a registered model "
          'needs Task() and Train() (Dev() and Test() are optional).')
  existing = _REGISTRY.get(key)
  if existing is not None and existing is not cls:
    raise ValueError(
        f"Model '{key}' is registered twice ({existing.__module__} and "
        f'{cls.__module__}); rename one of the classes.')
  _REGISTRY[key] = cls
  return cls


def _ImportAllBuiltins() -> None:
  try:
    package = importlib.import_module(_PARAMS_PACKAGE)
  except ImportError:
    return
  for info in pkgutil.walk_packages(package.__path__, _PARAMS_PACKAGE + '.'):
    importlib.import_module(info.name)


def _TryImport(key: str) -> None:
  module = key.rsplit('.', 1)[0] if '.' in key else ''
  for candidate in (f'{_PARAMS_PACKAGE}.{module}', module):
    if not candidate or candidate.endswith('.'):
      continue
    try:
      importlib.import_module(candidate)
    except ModuleNotFoundError as err:
      # Only swallow "this module does not exist", not errors inside it.
      if err.name and (candidate == err.name or
                       candidate.startswith(err.name + '.')):
        continue
      raise


class UnknownModelError(LookupError):
  """No params class is registered under the key; the message lists the
  closest keys. Its own class, so that a LookupError (KeyError,
  IndexError) raised inside a model's own code is not taken for it."""


def ModelNames() -> List[str]:
  """Every registered key, built-ins included, sorted."""
  _ImportAllBuiltins()
  return sorted(_REGISTRY)


def GetClass(key: str) -> Type[Any]:
  """The params class registered as `key`; imports its module if needed."""
  if key not in _REGISTRY:
    _TryImport(key)
  if key not in _REGISTRY:
    names = ModelNames()
    close = difflib.get_close_matches(key, names, n=3, cutoff=0.4)
    hint = (f'; did you mean {", ".join(repr(c) for c in close)}?' if close
            else f'; registered models: {", ".join(names)}')
    raise UnknownModelError(f"Unknown model '{key}'{hint}")
  return _REGISTRY[key]


def GetParams(key: str) -> hyperparams.Params:
  """Model params: `task`, `train_input`, `dev_input`, `test_input`.

  Dev and Test default to None when the class does not define them.
  """
  model = GetClass(key)()
  p = hyperparams.Params()
  p.Define('name', key, 'The registry key of the model.')
  p.Define('task', model.Task(), 'Task params.')
  for dataset in _DATASETS:
    method = getattr(model, dataset, None)
    p.Define(f'{dataset.lower()}_input', method() if method else None,
             f'Input params of the {dataset} dataset.')
  p.task.name = p.task.name or key.rsplit('.', 1)[-1]
  return p
