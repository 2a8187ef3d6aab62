"""Lingvo-compatible hyperparameters: `Params` and `InstantiableParams`.

A `Params` is an ordered set of named, documented values::

  p = Params()
  p.Define('dim', 16, 'Model dimension.')
  p.dim = 32
  p.Set(dim=64, **{'ffn.hidden_dim': 256, 'layers[0].dim': 8})

Fields of nested `Params`, and of `Params` in a list, are reached by paths
such as 'ffn.hidden_dim' or 'layers[0].dim' in `Get`, `Set`, `Delete`, `in`
and the text form (`ToText`, `FromText`, `TextDiff`; the value grammar and
its no-code-execution rule are in `params_text`).

`Freeze()` makes a params read-only all the way down: nested `Params` are
frozen, lists become `FrozenList`, dicts `FrozenDict`, sets `frozenset`.
`Copy()` returns a mutable deep copy (frozen containers become lists and
dicts again); classes, enum members and dtypes are shared, not copied.
`copy.copy` and `copy.deepcopy` both return `Copy()`.
"""

import copy
import difflib
import enum
import keyword
import math
import numbers
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import tensorflow as tf

from lingvo_pipe.core import params_text

_ParamsT = TypeVar('_ParamsT', bound='Params')
_SHARED = (type(None), bool, int, float, complex, str, bytes, type, enum.Enum,
           tf.dtypes.DType, types.FunctionType, types.BuiltinFunctionType,
           types.ModuleType)


class FrozenParamsError(TypeError):
  """Raised on an attempt to modify a frozen `Params`."""


class FrozenList(Sequence):
  """The read-only list a frozen `Params` holds in place of a `list`.

  Compares equal to a `list` (or `FrozenList`) with equal items, never to a
  tuple, so the list/tuple distinction of the text form is kept.
  """
  __slots__ = ('_items',)

  def __init__(self, items: Any = ()) -> None:
    self._items = tuple(items)

  def __getitem__(self, index: Any) -> Any:
    if isinstance(index, slice):
      return FrozenList(self._items[index])
    return self._items[index]

  def __len__(self) -> int:
    return len(self._items)

  def __eq__(self, other: Any) -> bool:
    if isinstance(other, (list, FrozenList)):
      return list(self._items) == list(other)
    return NotImplemented

  def __hash__(self) -> int:
    return hash(self._items)

  def __repr__(self) -> str:
    return f'FrozenList({list(self._items)!r})'


class FrozenDict(Mapping):
  """The read-only mapping a frozen `Params` holds in place of a `dict`."""
  __slots__ = ('_items',)

  def __init__(self, items: Any = ()) -> None:
    self._items = dict(items)

  def __getitem__(self, key: Any) -> Any:
    return self._items[key]

  def __iter__(self) -> Iterator[Any]:
    return iter(self._items)

  def __len__(self) -> int:
    return len(self._items)

  def __repr__(self) -> str:
    return f'FrozenDict({self._items!r})'


class Params:
  """An ordered set of named, described hyperparameters (see module doc)."""

  def __init__(self) -> None:
    self._values: dict[str, Any] = {}
    self._descriptions: dict[str, str] = {}
    self._frozen = False

  def __setattr__(self, name: str, value: Any) -> None:
    if name.startswith('_'):
      object.__setattr__(self, name, value)
    else:
      self.Set(**{name: value})

  def __getattr__(self, name: str) -> Any:
    values = self.__dict__.get('_values')
    if name.startswith('_') or values is None:
      raise AttributeError(name)
    if name not in values:
      raise AttributeError(self._UnknownMessage(name, []))
    return values[name]

  def __dir__(self) -> list[str]:
    return sorted(set(super().__dir__()) | set(self._values))

  def Define(self, name: str, default_value: Any, description: str) -> None:
    """Defines param `name` with its default value and a description."""
    problem = None
    if not isinstance(name, str) or not name.isidentifier():
      problem = 'use a Python identifier such as "hidden_dim"'
    elif keyword.iskeyword(name):
      problem = 'it is a Python keyword'
    elif name.startswith('_'):
      problem = 'names starting with "_" are reserved for Params internals'
    elif hasattr(type(self), name):
      problem = f'it clashes with {type(self).__name__}.{name}'
    if problem:
      raise ValueError(f'Bad param name {name!r}: {problem}.')
    if name in self._values:
      raise AttributeError(f'Param {name!r} is already defined in '
                           f'{self._Label()}; set it instead of redefining.')
    if not isinstance(description, str) or not description.strip():
      raise ValueError(f'Define({name!r}) needs a description: a non-empty '
                       'string saying what the param does.')
    self._CheckMutable(f'define {name!r}')
    self._values[name] = default_value
    self._descriptions[name] = description

  def Get(self, name: str) -> Any:
    """Returns the value at a path, e.g. 'dim', 'ffn.dim', 'layers[0].dim'."""
    node, parts = self._Walk(name)
    return _Child(node, parts)

  def Set(self: _ParamsT, /, **kwargs: Any) -> _ParamsT:
    """Sets params by name or path and returns self.

    Paths go through a dict: `p.Set(**{'ffn.dim': 8, 'layers[0].dim': 4})`.
    Every key is checked before any value changes.
    """
    targets = []
    for name, value in kwargs.items():
      node, parts = self._Walk(name)
      _Child(node, parts)
      _CheckSettable(node, parts)
      targets.append((node, parts[-1], value))
    for node, last, value in targets:
      _Assign(node, last, value)
    return self

  def Delete(self: _ParamsT, *names: str) -> _ParamsT:
    """Deletes the params named by `names` (names or paths); returns self."""
    targets = []
    for name in names:
      node, parts = self._Walk(name)
      _Child(node, parts)
      if not isinstance(node, Params):
        raise TypeError(f'Cannot delete {name!r}: only params can be deleted, '
                        'not list items.')
      node._CheckMutable(f'delete {name!r}')
      targets.append((node, parts[-1]))
    for node, last in targets:
      node._values.pop(last, None)
      node._descriptions.pop(last, None)
    return self

  def Copy(self: _ParamsT) -> _ParamsT:
    """Returns a mutable deep copy (see the module docstring)."""
    result = object.__new__(type(self))
    result.__dict__.update(self.__dict__)
    result._values = {k: _CopyValue(v) for k, v in self._values.items()}
    result._descriptions = dict(self._descriptions)
    result._frozen = False
    return result

  def __copy__(self: _ParamsT) -> _ParamsT:
    return self.Copy()

  def __deepcopy__(self: _ParamsT, memo: Any) -> _ParamsT:
    return self.Copy()

  def Freeze(self: _ParamsT) -> _ParamsT:
    """Makes this params read-only all the way down; returns self."""
    if not self._frozen:
      self._frozen = True
      for name, value in self._values.items():
        self._values[name] = _FreezeValue(value)
    return self

  def IsFrozen(self) -> bool:
    """Whether `Freeze()` was called (`Copy()` is never frozen)."""
    return self._frozen

  def IterParams(self) -> Iterator[tuple[str, Any]]:
    """Yields (name, value) of the top-level params in definition order."""
    yield from list(self._values.items())

  def __contains__(self, name: Any) -> bool:
    try:
      _Child(*self._Walk(name))
    except (AttributeError, IndexError, TypeError, ValueError):
      return False
    return True

  def __len__(self) -> int:
    return len(self._values)

  def __eq__(self, other: Any) -> bool:
    if not isinstance(other, Params):
      return NotImplemented
    return (self._values.keys() == other._values.keys() and
            all(_ValuesEqual(v, other._values[k])
                for k, v in self._values.items()))

  __hash__ = None  # Mutable.

  def __repr__(self) -> str:
    return self.ToText()

  __str__ = __repr__

  def ToText(self) -> str:
    """Returns one `path : value` line per leaf, in definition order.

    Nested `Params` are flattened as 'ffn.dim : 8' and a non-empty list or
    tuple of `Params` as 'layers[0].dim : 8'; the value grammar is in
    `params_text`.
    """
    return ''.join(f'{path} : {_FormatLeaf(value)}\n'
                   for path, value in self._Leaves(''))

  def FromText(self: _ParamsT, text: str) -> _ParamsT:
    """Sets the params named in `text` (the `ToText` form); returns self.

    Every key must already be defined, and the nested `Params` and lists of
    `Params` it goes through must exist (with enough items): text sets
    values, it never builds structure. A value must fit the key's current
    type (numbers mix); a key holding None takes any value, and any key
    takes None. Blank lines and lines starting with '#' are skipped. All
    lines are checked before any value changes.

    Raises:
      params_text.ParamsTextError: (a ValueError) naming the line and key,
        with a "did you mean" for unknown keys.
      FrozenParamsError: if the params to set are frozen.
    """
    self._CheckMutable('run FromText')
    updates, seen = [], set()
    for number, line in enumerate(text.split('\n'), 1):
      line = line.strip()
      if not line or line.startswith('#'):
        continue
      try:
        updates.append(self._ParseLine(line, seen))
      except FrozenParamsError:
        raise
      except (params_text.ParamsTextError, AttributeError, IndexError,
              TypeError) as e:
        raise params_text.ParamsTextError(
            f'FromText line {number}: {e}') from None
    for node, last, value in updates:
      _Assign(node, last, value)
    return self

  def TextDiff(self, other: 'Params') -> str:
    """Returns the differing leaves of self and `other`, '' if none.

    Like diff(1) with self on the left: a leaf of self is written as
    '< path: value' and a leaf of `other` as '> path: value'. A path set in
    both gets both lines; a path in only one gets one line.
    """
    mine, theirs = dict(self._Leaves('')), dict(other._Leaves(''))
    lines = []
    for path in [*mine, *(p for p in theirs if p not in mine)]:
      if (path in mine and path in theirs and
          _ValuesEqual(mine[path], theirs[path])):
        continue
      if path in mine:
        lines.append(f'< {path}: {_FormatLeaf(mine[path])}\n')
      if path in theirs:
        lines.append(f'> {path}: {_FormatLeaf(theirs[path])}\n')
    return ''.join(lines)

  def _Leaves(self, prefix: str) -> Iterator[tuple[str, Any]]:
    for name, value in self._values.items():
      path = prefix + name
      if isinstance(value, Params):
        yield from value._Leaves(path + '.')
      elif _IsParamsList(value):
        for i, item in enumerate(value):
          yield from item._Leaves(f'{path}[{i}].')
      else:
        yield path, value

  def _ParseLine(self, line: str, seen: set[str]) -> tuple[Any, Any, Any]:
    """Returns (container, last path part, new value) for one text line."""
    key, colon, value_text = line.partition(':')
    if not colon:
      raise params_text.ParamsTextError(
          f"expected 'key : value', got {line!r}")
    node, parts = self._Walk(key.strip())
    key = params_text.FormatPath(parts)
    if key in seen:
      raise params_text.ParamsTextError(f'key {key!r} is set twice')
    seen.add(key)
    current = _Child(node, parts)
    if isinstance(current, Params):
      if params_text.ParseValue(value_text) is not None:
        raise params_text.ParamsTextError(
            f"{key!r} holds Params; set its fields as '{key}.<name> : value'")
      value = None
    else:
      value = params_text.ValueFromText(key, _Thaw(current), value_text)
    _CheckSettable(node, parts)
    return node, parts[-1], value

  def _Walk(self, path: str) -> tuple[Any, list[params_text.PathPart]]:
    """Returns (container of the last part, all parts) for `path`."""
    parts = params_text.ParsePath(path)
    node = self
    for i in range(1, len(parts)):
      node = _Child(node, parts[:i])
    return node, parts

  def _Label(self) -> str:
    """Names this params in messages, e.g. "FeedForward params 'ffn'"."""
    cls = self._values.get('cls')
    label = f'{cls.__name__} params' if isinstance(cls, type) else (
        type(self).__name__)
    name = self._values.get('name')
    return f'{label} {name!r}' if isinstance(name, str) and name else label

  def _UnknownMessage(self, name: str, at: list[Any]) -> str:
    where = self._Label()
    if at:
      where += f' at {params_text.FormatPath(at)!r}'
    known = list(self._values)
    close = difflib.get_close_matches(name, known, n=1)
    if close:
      hint = f'did you mean {close[0]!r}?'
    elif known:
      hint = 'defined: ' + ', '.join(known[:10]) + (
          ', ...' if len(known) > 10 else '')
    else:
      hint = 'it defines no params'
    return f'Unknown param {name!r} in {where}; {hint}'

  def _CheckMutable(self, action: str) -> None:
    if self._frozen:
      raise FrozenParamsError(
          f'Cannot {action}: {self._Label()} is frozen; use Copy() to get a '
          'mutable copy.')


class InstantiableParams(Params):
  """Params with a `cls` param: `Instantiate()` returns `cls(self)`."""

  def __init__(self, cls: type | None = None) -> None:
    super().__init__()
    self.Define('cls', cls, 'The class that Instantiate() builds.')

  def Instantiate(self, /, **kwargs: Any) -> Any:
    """Returns `self.cls(self, **kwargs)`; the object receives these params."""
    if self.cls is None:
      raise ValueError(f'Cannot Instantiate {self._Label()}: cls is None; set '
                       'p.cls to the class to build.')
    return self.cls(self, **kwargs)


def _Child(node: Any, parts: list[params_text.PathPart]) -> Any:
  """Returns `node`'s child named by parts[-1]; parts is its full path."""
  part, at = parts[-1], parts[:-1]
  where = params_text.FormatPath(at)
  if isinstance(part, str):
    if not isinstance(node, Params):
      raise TypeError(f'Cannot get {part!r} from {where!r}: it holds '
                      f'{type(node).__name__}, not Params.')
    if part not in node._values:
      raise AttributeError(node._UnknownMessage(part, at))
    return node._values[part]
  if not isinstance(node, (list, tuple, FrozenList)):
    raise TypeError(f'Cannot index {where!r} with [{part}]: it holds '
                    f'{type(node).__name__}, not a list.')
  if part >= len(node):
    raise IndexError(f'Index [{part}] is out of range for {where!r}, which '
                     f'has {len(node)} items.')
  return node[part]


def _CheckSettable(node: Any, parts: list[params_text.PathPart]) -> None:
  path = params_text.FormatPath(parts)
  if isinstance(node, Params):
    node._CheckMutable(f'set {path!r}')
  elif isinstance(node, FrozenList):
    raise FrozenParamsError(f'Cannot set {path!r}: its list is frozen; use '
                            'Copy() to get a mutable copy.')
  elif not isinstance(node, list):
    where = params_text.FormatPath(parts[:-1])
    raise TypeError(f'Cannot set {path!r}: {where!r} is a '
                    f'{type(node).__name__}; set the whole {where!r}.')


def _Assign(node: Any, last: params_text.PathPart, value: Any) -> None:
  if isinstance(node, Params):
    node._values[last] = value
  else:
    node[last] = value


def _IsParamsList(value: Any) -> bool:
  return (isinstance(value, (list, tuple, FrozenList)) and bool(value) and
          all(isinstance(v, Params) for v in value))


def _MapTuple(value: tuple[Any, ...],
              fn: Callable[[Any], Any]) -> tuple[Any, ...]:
  items = [fn(v) for v in value]
  if hasattr(value, '_fields'):  # A namedtuple.
    return type(value)(*items)
  return type(value)(items)


def _CopyValue(value: Any) -> Any:
  if isinstance(value, Params):
    return value.Copy()
  if isinstance(value, FrozenList) or type(value) is list:
    return [_CopyValue(v) for v in value]
  if type(value) is tuple:
    return tuple(_CopyValue(v) for v in value)
  if isinstance(value, FrozenDict) or type(value) is dict:
    return {k: _CopyValue(v) for k, v in value.items()}
  if isinstance(value, _SHARED):
    return value
  return copy.deepcopy(value)


def _FreezeValue(value: Any) -> Any:
  if isinstance(value, Params):
    return value.Freeze()
  if isinstance(value, list):
    return FrozenList(_FreezeValue(v) for v in value)
  if isinstance(value, tuple):
    return _MapTuple(value, _FreezeValue)
  if isinstance(value, dict):
    return FrozenDict({k: _FreezeValue(v) for k, v in value.items()})
  if isinstance(value, set):
    return frozenset(value)
  return value


def _Thaw(value: Any) -> Any:
  """Frozen containers back to lists and dicts, for the text form."""
  if isinstance(value, (list, FrozenList)):
    return [_Thaw(v) for v in value]
  if isinstance(value, tuple):  # A namedtuple is written as a tuple.
    return tuple(_Thaw(v) for v in value)
  if isinstance(value, (dict, FrozenDict)):
    return {k: _Thaw(v) for k, v in value.items()}
  return value


def _FormatLeaf(value: Any) -> str:
  return params_text.FormatValue(_Thaw(value))


def _ValuesEqual(a: Any, b: Any) -> bool:
  """Deep equality; NaN equals NaN, lists differ from tuples, 1 from True."""
  if isinstance(a, Params) or isinstance(b, Params):
    return isinstance(a, Params) and isinstance(b, Params) and a == b
  if isinstance(a, (list, FrozenList)) or isinstance(b, (list, FrozenList)):
    return (isinstance(a, (list, FrozenList)) and
            isinstance(b, (list, FrozenList)) and _ItemsEqual(a, b))
  if isinstance(a, tuple) or isinstance(b, tuple):
    return isinstance(a, tuple) and isinstance(b, tuple) and _ItemsEqual(a, b)
  if isinstance(a, Mapping) and isinstance(b, Mapping):
    return set(a) == set(b) and all(_ValuesEqual(a[k], b[k]) for k in a)
  kind_a, kind_b = _ScalarKind(a), _ScalarKind(b)
  if kind_a != kind_b:
    return False
  if kind_a == 'float' and math.isnan(a):
    return math.isnan(b)
  try:
    result = a == b
  except (TypeError, ValueError):  # E.g. arrays of different shapes.
    return False
  if isinstance(result, bool):
    return result
  all_fn = getattr(result, 'all', None)  # E.g. numpy arrays.
  return bool(all_fn()) if callable(all_fn) else bool(result)


def _ScalarKind(value: Any) -> str | None:
  """'None', 'bool', 'int', 'float' or 'str'; None for other values."""
  if value is None:
    return 'None'
  if isinstance(value, bool):
    return 'bool'
  if isinstance(value, enum.Enum):
    return None
  if isinstance(value, numbers.Integral):
    return 'int'
  if isinstance(value, numbers.Real):
    return 'float'
  return 'str' if isinstance(value, str) else None


def _ItemsEqual(a: Sequence[Any], b: Sequence[Any]) -> bool:
  return len(a) == len(b) and all(map(_ValuesEqual, a, b))
