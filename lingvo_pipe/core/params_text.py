r"""Text form of `Params` values: key paths, value formatting and parsing.

`Params.ToText()` writes one line per leaf, `path : value`. A path is param
names joined by '.', with `[i]` selecting an item of a list of `Params`::

  dim : 16
  ffn.activation : 'relu'
  layers[0].dtype : tf.float32

Value grammar (a subset of Python literals)::

  value  := 'None' | 'True' | 'False' | number | string | name
          | '[' [value (',' value)* [',']] ']'      a list
          | '(' [value (',' value)* [',']] ')'      a tuple; (x,) has one item
          | '{' [value ':' value (',' ...)* [',']] '}'   a dict
  number := an int (-12) or a float as Python's repr writes it
            (0.5, -0.0, 1e-05, inf, -inf, nan)
  string := '...' or "..." with escapes \\ \' \" \n \r \t \xNN \uNNNN
            \UNNNNNNNN; each string stays on one line
  name   := tf.<dtype> (tf.float32), module.QualName (a class) or
            module.EnumClass.MEMBER (an enum member)

A '#' after a value starts a comment. Values of other types (functions,
arrays, Params inside a dict) are written as `<repr>`, for reading only.

A key whose current value is a str also takes a bare word, as Lingvo's
`FromText` does: `schedule : 1f1b` sets '1f1b' (see `ValueFromText`).

Parsing never executes the text: no eval, exec, pickle or literal_eval. The
parser below builds only None, bools, numbers, strings, lists, tuples, dicts
and `DottedName` placeholders. `tf.<dtype>` names map to dtypes without any
import. Other names are resolved by importing their module (which runs that
module's top-level code, as any import does) only when the key's current value
admits a class: it is None, a class, an enum member, or a list, tuple or dict
that is empty or already holds a class or enum member. The resolved object
must be a class or an enum member; it is never called.
"""

import dataclasses
import enum
import importlib
import numbers
import re
import sys
from typing import Any, Callable, NoReturn

import tensorflow as tf

PathPart = str | int

_MAX_DEPTH = 100
_PATH_NAME = re.compile(r'[A-Za-z_]\w*')
_PATH_STEP = re.compile(r'\.([A-Za-z_]\w*)|\[(\d+)\]')
_NUMBER = re.compile(
    r'[-+]?(?:(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|inf|nan)(?![\w.])')
_INT = re.compile(r'[-+]?\d+')
_NAME = re.compile(r'[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*')
# One word (no spaces, quotes, backslash, '#' or brackets), then a comment.
_BARE_WORD = re.compile(r'([^\s\'"\\#()\[\]{}]+)\s*(?:#.*)?')
_SPACE = re.compile(r'\s*')
_CONSTANTS = {'None': None, 'True': True, 'False': False}
_ESCAPES_IN = {'\\': '\\', "'": "'", '"': '"', 'n': '\n', 'r': '\r',
               't': '\t'}
_ESCAPES_OUT = {'\\': '\\\\', '\n': '\\n', '\r': '\\r', '\t': '\\t'}
_HEX_WIDTHS = {'x': 2, 'u': 4, 'U': 8}


class ParamsTextError(ValueError):
  """A params text (a key path, a value or a whole line) is invalid."""


@dataclasses.dataclass(frozen=True)
class DottedName:
  """An unresolved `module.Name` or `tf.dtype` read by `ParseValue`."""
  path: str


def ParsePath(path: str) -> list[PathPart]:
  """Splits 'layers[0].dim' into ['layers', 0, 'dim']."""
  match = _PATH_NAME.match(path) if isinstance(path, str) else None
  if match is None:
    raise ParamsTextError(_BadPath(path))
  parts: list[PathPart] = [match.group()]
  pos = match.end()
  while pos < len(path):
    match = _PATH_STEP.match(path, pos)
    if match is None:
      raise ParamsTextError(_BadPath(path))
    name, index = match.groups()
    parts.append(name if name is not None else int(index))
    pos = match.end()
  return parts


def _BadPath(path: Any) -> str:
  return (f'Bad param path {path!r}: write names joined by "." with optional '
          '[index], e.g. "layers[0].dim"')


def FormatPath(parts: list[PathPart]) -> str:
  """Inverse of `ParsePath`: ['layers', 0, 'dim'] -> 'layers[0].dim'."""
  text = ''
  for part in parts:
    text += f'[{part}]' if isinstance(part, int) else f'.{part}'
  return text.lstrip('.')


def QuoteString(text: str) -> str:
  """Quotes `text` on one line so that `ParseValue` returns it unchanged."""
  quote = '"' if "'" in text and '"' not in text else "'"
  out = [quote]
  for ch in text:
    code = ord(ch)
    if ch == quote:
      out.append('\\' + ch)
    elif ch in _ESCAPES_OUT:
      out.append(_ESCAPES_OUT[ch])
    elif code < 0x20 or 0x7f <= code <= 0x9f:
      out.append(f'\\x{code:02x}')
    elif code in (0x2028, 0x2029) or 0xd800 <= code <= 0xdfff:
      out.append(f'\\u{code:04x}')
    else:
      out.append(ch)
  out.append(quote)
  return ''.join(out)


def _ClassPath(cls: type) -> str:
  return f'{cls.__module__}.{cls.__qualname__}'


def FormatValue(value: Any) -> str:
  """Writes `value` in the value grammar (see the module docstring)."""
  if value is None or isinstance(value, bool):
    return repr(value)
  if isinstance(value, enum.Enum):
    return f'{_ClassPath(type(value))}.{value.name}'
  if isinstance(value, numbers.Integral):
    return repr(int(value))
  if isinstance(value, numbers.Real):
    return repr(float(value))
  if isinstance(value, str):
    return QuoteString(value)
  if isinstance(value, type):
    return _ClassPath(value)
  if isinstance(value, tf.dtypes.DType):
    return f'tf.{value.name}'
  if isinstance(value, tuple):
    items = [FormatValue(v) for v in value]
    return f'({items[0]},)' if len(items) == 1 else f'({", ".join(items)})'
  if isinstance(value, list):
    return f'[{", ".join(FormatValue(v) for v in value)}]'
  if isinstance(value, dict):
    items = (f'{FormatValue(k)}: {FormatValue(v)}' for k, v in value.items())
    return '{' + ', '.join(items) + '}'
  text = repr(value).replace('\n', '\\n')
  return text if text.startswith('<') else f'<{text}>'


def ParseValue(text: str) -> Any:
  """Parses one value; names are left as `DottedName` (see `ResolveNames`)."""
  return _Parser(text).Parse()


class _Parser:
  """Recursive-descent parser for the value grammar; builds plain data."""

  def __init__(self, text: str) -> None:
    self._text = text
    self._pos = 0
    self._depth = 0

  def Parse(self) -> Any:
    value = self._Value()
    self._SkipSpace()
    if self._Peek() not in ('', '#'):
      self._Fail('unexpected text after the value')
    return value

  def _Fail(self, message: str) -> NoReturn:
    text = self._text if len(self._text) <= 60 else self._text[:57] + '...'
    raise ParamsTextError(f'{message} at column {self._pos + 1} of {text!r}')

  def _SkipSpace(self) -> None:
    self._pos = _SPACE.match(self._text, self._pos).end()

  def _Peek(self) -> str:
    return self._text[self._pos:self._pos + 1]

  def _Value(self) -> Any:
    self._SkipSpace()
    ch = self._Peek()
    if ch in ('[', '(', '{'):
      self._depth += 1
      if self._depth > _MAX_DEPTH:
        self._Fail(f'values nest deeper than {_MAX_DEPTH} levels')
      value = self._Dict() if ch == '{' else self._Sequence(ch)
      self._depth -= 1
      return value
    if ch in ('"', "'"):
      return self._String(ch)
    match = _NUMBER.match(self._text, self._pos)
    if match:
      self._pos = match.end()
      token = match.group()
      return int(token) if _INT.fullmatch(token) else float(token)
    match = _NAME.match(self._text, self._pos)
    if match:
      word = match.group()
      if word in _CONSTANTS:
        self._pos = match.end()
        return _CONSTANTS[word]
      if '.' not in word:
        self._Fail(_NotAValue(word))
      self._pos = match.end()
      return DottedName(word)
    if not ch:
      self._Fail('missing value')
    if ch == '<':
      self._Fail('<...> values are written by ToText for reading only')
    self._Fail(f'unexpected {ch!r}')

  def _Items(self, closer: str, parse_item: Callable[[], None]) -> bool:
    """Parses `item, item, ... closer`; returns whether a comma was seen."""
    self._pos += 1
    saw_comma = False
    while True:
      self._SkipSpace()
      if self._Peek() == closer:
        self._pos += 1
        return saw_comma
      parse_item()
      self._SkipSpace()
      if self._Peek() == ',':
        self._pos += 1
        saw_comma = True
      elif not self._Peek():
        self._Fail(f'missing "{closer}"')
      elif self._Peek() != closer:
        self._Fail(f'expected "," or "{closer}"')

  def _Sequence(self, opener: str) -> Any:
    items = []
    closer = ']' if opener == '[' else ')'
    saw_comma = self._Items(closer, lambda: items.append(self._Value()))
    if opener == '[':
      return items
    if len(items) == 1 and not saw_comma:
      return items[0]  # (x) groups, as in Python; (x,) is a 1-tuple.
    return tuple(items)

  def _Dict(self) -> dict[Any, Any]:
    result = {}

    def ParseItem() -> None:
      self._SkipSpace()
      start = self._pos
      key = self._Value()
      try:
        hash(key)
      except TypeError:
        self._pos = start
        self._Fail('a dict key must be a string, number, name or tuple')
      if key in result:
        self._pos = start
        self._Fail(f'duplicate dict key {key!r}')
      self._SkipSpace()
      if self._Peek() != ':':
        self._Fail('expected ":" after a dict key')
      self._pos += 1
      result[key] = self._Value()

    self._Items('}', ParseItem)
    return result

  def _String(self, quote: str) -> str:
    text, pos, out = self._text, self._pos + 1, []
    while True:
      ch = text[pos:pos + 1]
      if ch in ('', '\n', '\r'):
        self._pos = pos
        self._Fail('unterminated string')
      if ch == quote:
        self._pos = pos + 1
        return ''.join(out)
      if ch != '\\':
        out.append(ch)
        pos += 1
        continue
      self._pos = pos
      escape = text[pos + 1:pos + 2]
      if escape in _ESCAPES_IN:
        out.append(_ESCAPES_IN[escape])
        pos += 2
        continue
      width = _HEX_WIDTHS.get(escape, 0)
      digits = text[pos + 2:pos + 2 + width]
      if not width or not re.fullmatch(f'[0-9a-fA-F]{{{width}}}', digits):
        self._Fail(f'bad escape {text[pos:pos + 2 + width]!r} in a string')
      if int(digits, 16) > sys.maxunicode:
        self._Fail(f'escape {text[pos:pos + 2 + width]!r} is past U+10FFFF')
      out.append(chr(int(digits, 16)))
      pos += 2 + width


def _NotAValue(word: str) -> str:
  return (f'bare word {word!r} is not a value (quote a string: '
          f'{QuoteString(word)})')


def _HoldsClass(value: Any) -> bool:
  if isinstance(value, (type, enum.Enum)):
    return True
  if isinstance(value, dict):
    return any(_HoldsClass(v) for v in (*value.keys(), *value.values()))
  if isinstance(value, (list, tuple)):
    return any(_HoldsClass(v) for v in value)
  return False


def AllowsImport(current: Any) -> bool:
  """Whether a key holding `current` may name classes (see module doc)."""
  if current is None or _HoldsClass(current):
    return True
  return isinstance(current, (list, tuple, dict)) and not current


def ResolveNames(value: Any, allow_import: bool) -> Any:
  """Replaces each `DottedName` in `value` by the dtype, class or member."""
  if isinstance(value, DottedName):
    return _ResolveName(value.path, allow_import)
  if isinstance(value, list):
    return [ResolveNames(v, allow_import) for v in value]
  if isinstance(value, tuple):
    return tuple(ResolveNames(v, allow_import) for v in value)
  if isinstance(value, dict):
    return {ResolveNames(k, allow_import): ResolveNames(v, allow_import)
            for k, v in value.items()}
  return value


def _ResolveName(path: str, allow_import: bool) -> Any:
  if path.startswith('tf.'):
    try:
      return tf.dtypes.as_dtype(path[3:])
    except TypeError:
      raise ParamsTextError(f'{path!r} is not a TensorFlow dtype; write one '
                            'like tf.float32') from None
  if not allow_import:
    raise ParamsTextError(f'name {path!r} is only resolved for params that '
                          'hold None, a class or an enum member')
  parts = path.split('.')
  for i in range(len(parts) - 1, 0, -1):
    module_name = '.'.join(parts[:i])
    module = sys.modules.get(module_name) or _Import(module_name, path)
    if module is not None:
      return _GetClassOrMember(module, module_name, parts[i:], path)
  raise ParamsTextError(f'no module found for {path!r}; write '
                        'module.ClassName or module.EnumClass.MEMBER')


def _Import(module_name: str, path: str) -> Any:
  """Imports `module_name`, or returns None if no such module exists."""
  try:
    return importlib.import_module(module_name)
  except ModuleNotFoundError as e:
    if e.name and (module_name + '.').startswith(e.name + '.'):
      return None
    raise ParamsTextError(f'importing {module_name!r} for {path!r} failed: '
                          f'{e}') from None
  except ImportError as e:
    raise ParamsTextError(f'importing {module_name!r} for {path!r} failed: '
                          f'{e}') from None


def _GetClassOrMember(module: Any, module_name: str, attrs: list[str],
                      path: str) -> Any:
  value = module
  for attr in attrs:
    if attr.startswith('__'):
      raise ParamsTextError(f'{path!r}: dunder names are not resolved')
    if not hasattr(value, attr):
      raise ParamsTextError(f'{path!r}: {module_name!r} has no '
                            f'{".".join(attrs)!r}')
    value = getattr(value, attr)
  if not isinstance(value, (type, enum.Enum)):
    raise ParamsTextError(f'{path!r} is a {type(value).__name__}, not a class '
                          'or an enum member')
  return value


def _Fits(current: Any, value: Any) -> bool:
  """Whether `value` may replace `current` (numbers mix; None always fits)."""
  if value is None or current is None:
    return True
  if isinstance(current, bool):
    return isinstance(value, bool)
  if isinstance(current, enum.Enum):
    return isinstance(value, type(current))
  if isinstance(current, numbers.Real):
    return (isinstance(value, numbers.Real) and
            not isinstance(value, (bool, enum.Enum)))
  if isinstance(current, str):
    return isinstance(value, str)
  if isinstance(current, type):
    return isinstance(value, type)
  if isinstance(current, tf.dtypes.DType):
    return isinstance(value, tf.dtypes.DType)
  if isinstance(current, (list, tuple)):
    return isinstance(value, (list, tuple))
  if isinstance(current, dict):
    return isinstance(value, dict)
  return False


def _Expectation(current: Any) -> str:
  """What a key holding `current` accepts, and an example to write."""
  kind = type(current).__name__
  if current is None:
    return 'any value'
  if isinstance(current, bool):
    return 'bool (write True or False)'
  if isinstance(current, enum.Enum):
    return f'{kind} (write a member, e.g. {FormatValue(current)})'
  if isinstance(current, numbers.Real):
    return f'{kind} (write a number, e.g. 3 or 0.5)'
  if isinstance(current, str):
    return "str (write a quoted string, e.g. 'abc')"
  if isinstance(current, type):
    return f'a class (write its import path, e.g. {FormatValue(current)})'
  if isinstance(current, tf.dtypes.DType):
    return 'a tf.DType (write e.g. tf.float32)'
  if isinstance(current, (list, tuple)):
    return f'{kind} (write e.g. [1, 2] or (1, 2))'
  if isinstance(current, dict):
    return "dict (write e.g. {'a': 1})"
  return f'{kind}, which text cannot express (set it in Python, or write None)'


def _ParseWhole(text: str, word: str | None) -> Any:
  """`ParseValue`; if `text` is the bare `word`, an error says to quote it."""
  try:
    return ParseValue(text)
  except ParamsTextError:
    if word is None:
      raise
    raise ParamsTextError(_NotAValue(word)) from None


def ValueFromText(key: str, current: Any, text: str) -> Any:
  """Parses `text` as the new value of `key`, which now holds `current`.

  `text` is stripped. If `current` is a str, a bare word is also read as a
  str, as Lingvo does: one word with no spaces, quotes, backslash, '#' or
  brackets (an optional '# comment' may follow), that is not a literal of
  another kind. So `1f1b`, `zb_v`, `/tmp/my_table.csv`, `gs://b/x-*`, `1.2.3`
  and `a.b` (a name, but a str key never resolves one) are strs, while
  `None`, `True`, `False`, a number (`12`, `inf`) and `tf.<dtype>` keep their
  meaning: None is taken, the others fail as a type mismatch that says to
  quote. Quoted strings parse as everywhere, and `ToText` always quotes, so
  the text round trip is exact. Keys holding anything else never take a bare
  word.

  Raises:
    ParamsTextError: naming `key`, what it expects and how to write it, if the
      text does not parse or its type does not fit `current`.
  """
  expects = _Expectation(current)
  text = text.strip()
  match = _BARE_WORD.fullmatch(text)
  word = match.group(1) if match else None
  try:
    value = ResolveNames(_ParseWhole(text, word), AllowsImport(current))
  except ParamsTextError as e:
    if word is not None and isinstance(current, str):
      return word
    raise ParamsTextError(f'bad value for {key!r}, which expects {expects}: '
                          f'{e}') from None
  if not _Fits(current, value):
    kind = 'class' if isinstance(value, type) else type(value).__name__
    raise ParamsTextError(f'{key!r} expects {expects}; got {kind} {text!r}')
  return value
