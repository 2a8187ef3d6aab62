"""NestedMap: a dict with attribute access, for structures of tensors.

Layers pass a `NestedMap` instead of positional tuples:

  inputs = NestedMap(vec=x, paddings=p)
  inputs.vec            # same as inputs['vec']

A NestedMap is a `dict`, so `tf.nest` treats it as a mapping (sorted keys)
and rebuilds it as a NestedMap. `Flatten` and `Pack` use the same order as
`tf.nest.flatten` / `tf.nest.pack_sequence_as`, recursing into NestedMaps,
dicts, lists and tuples.
"""

from __future__ import annotations

import difflib
from typing import Any, Callable, Iterable, List, Tuple


def _IsContainer(v: Any) -> bool:
  return isinstance(v, (dict, list, tuple))


class NestedMap(dict):
  """A dict whose keys are also attributes: `m.x` is `m['x']`."""

  # Names that would shadow dict or NestedMap methods as attributes.
  _RESERVED = frozenset(dir(dict)) | frozenset([
      'Copy', 'DeepCopy', 'Flatten', 'FlattenItems', 'Pack', 'Transform',
      'Filter', 'DebugString', 'IsCompatible', 'CheckKey'])

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    for key in self:
      NestedMap.CheckKey(key)

  @staticmethod
  def CheckKey(key: Any) -> None:
    """Raises ValueError unless `key` can be an attribute name."""
    if not isinstance(key, str) or not key.isidentifier():
      raise ValueError(
          f'NestedMap key {key!r} is not a Python identifier; use a name '
          'like "my_key".')
    if (key in NestedMap._RESERVED or key.startswith('__') or
        hasattr(NestedMap, key)):
      raise ValueError(
          f'NestedMap key {key!r} is reserved (it would hide a method); '
          f'rename it, e.g. "{key}_value".')

  def __setitem__(self, key: str, value: Any) -> None:
    NestedMap.CheckKey(key)
    super().__setitem__(key, value)

  def __setattr__(self, name: str, value: Any) -> None:
    self[name] = value

  def __getattr__(self, name: str) -> Any:
    try:
      return self[name]
    except KeyError:
      close = difflib.get_close_matches(name, [str(k) for k in self], n=1)
      hint = f"; did you mean '{close[0]}'?" if close else ''
      raise AttributeError(
          f"NestedMap has no key '{name}' (keys: {sorted(self)}){hint}"
      ) from None

  def __delattr__(self, name: str) -> None:
    try:
      del self[name]
    except KeyError:
      raise AttributeError(f"NestedMap has no key '{name}'") from None

  def update(self, *args, **kwargs) -> None:  # keep keys checked
    for key, value in dict(*args, **kwargs).items():
      self[key] = value

  def setdefault(self, key: str, default: Any = None) -> Any:
    if key not in self:
      self[key] = default
    return self[key]

  def __ior__(self, other: Any) -> 'NestedMap':  # keep keys checked
    self.update(other)
    return self

  def Copy(self) -> 'NestedMap':
    """A shallow copy: new maps all the way down, the same leaves."""
    return self.Pack(self.Flatten())

  def DeepCopy(self) -> 'NestedMap':
    """Alias of Copy: leaves (tensors) are immutable and are shared."""
    return self.Copy()

  def FlattenItems(self) -> List[Tuple[str, Any]]:
    """(path, leaf) pairs in `tf.nest.flatten` order; paths like 'a.b[0]'."""
    out: List[Tuple[str, Any]] = []

    def Visit(prefix: str, v: Any) -> None:
      if isinstance(v, dict):
        for k in sorted(v):
          Visit(f'{prefix}.{k}' if prefix else str(k), v[k])
      elif isinstance(v, (list, tuple)):
        for i, item in enumerate(v):
          Visit(f'{prefix}[{i}]', item)
      else:
        out.append((prefix, v))

    Visit('', self)
    return out

  def Flatten(self) -> List[Any]:
    """The leaves, in `tf.nest.flatten` order (sorted keys)."""
    return [v for _, v in self.FlattenItems()]

  def Pack(self, leaves: Iterable[Any]) -> 'NestedMap':
    """A NestedMap of the same structure with `leaves` in Flatten order."""
    leaves = list(leaves)
    it = iter(leaves)

    def Build(v: Any) -> Any:
      if isinstance(v, dict):
        # A list, not a generator: PEP 479 would turn StopIteration into
        # RuntimeError inside a generator.
        return type(v)([(k, Build(v[k])) for k in sorted(v)])
      if isinstance(v, (list, tuple)):
        items = [Build(x) for x in v]
        if hasattr(v, '_fields'):  # namedtuple
          return type(v)(*items)
        return type(v)(items)
      return next(it)

    try:
      packed = Build(self)
    except StopIteration:
      raise ValueError(
          f'Pack got {len(leaves)} leaves; this NestedMap has '
          f'{len(self.Flatten())}.') from None
    if next(it, it) is not it:
      raise ValueError(
          f'Pack got {len(leaves)} leaves; this NestedMap has '
          f'{len(self.Flatten())}.')
    return packed

  def Transform(self, fn: Callable[[Any], Any]) -> 'NestedMap':
    """A NestedMap of the same structure with `fn` applied to each leaf."""
    return self.Pack([fn(v) for v in self.Flatten()])

  def Filter(self, fn: Callable[[Any], bool]) -> 'NestedMap':
    """Keeps the leaves where `fn(leaf)` is true; drops emptied maps/lists."""
    drop = object()

    def Keep(v: Any) -> Any:
      if isinstance(v, dict):
        kept = type(v)()
        for k in sorted(v):
          r = Keep(v[k])
          if r is not drop:
            kept[k] = r
        return kept if kept else drop
      if isinstance(v, (list, tuple)):
        kept_items = [r for r in (Keep(x) for x in v) if r is not drop]
        if not kept_items:
          return drop
        if hasattr(v, '_fields'):  # namedtuple: all fields or none
          if len(kept_items) != len(v):
            raise ValueError(
                f'Filter cannot drop some fields of {type(v).__name__}; '
                'filter a NestedMap or list instead.')
          return type(v)(*kept_items)
        return type(v)(kept_items)
      return v if fn(v) else drop

    result = Keep(self)
    return NestedMap() if result is drop else result

  def IsCompatible(self, other: 'NestedMap') -> bool:
    """True if `other` has the same structure (keys, list lengths)."""
    mine = [k for k, _ in self.FlattenItems()]
    return isinstance(other, dict) and mine == [
        k for k, _ in NestedMap(other).FlattenItems()]

  def DebugString(self) -> str:
    """One 'path  value' line per leaf, sorted by path."""
    items = self.FlattenItems()
    width = max((len(k) for k, _ in items), default=0)
    return '\n'.join(f'{k.ljust(width)}  {v}' for k, v in items)
