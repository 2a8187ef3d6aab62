"""Checks that our code never runs AutoGraph (docs/DESIGN.md section 1).

Every `tf.function` in lingvo_pipe/, params/ and tests/ (a call or a
decorator) passes `autograph=False`, and every function handed to a
`.map`, `.filter`, `.flat_map`, `.interleave`, `.scan` or
`.bucket_by_sequence_length` (tf.data's, which would convert it) is
wrapped in `tf.autograph.experimental.do_not_convert`.
Under Bazel the files come from the runfiles, as for
//tests:bazel_build_test.
"""

import ast
import os
from typing import List

from absl.testing import absltest

_ROOTS = ('lingvo_pipe', 'params', 'tests')
# tf.data's methods that take a function: the function's position.
_DATASET_METHODS = {'map': 0, 'filter': 0, 'flat_map': 0, 'interleave': 0,
                    'scan': 1, 'bucket_by_sequence_length': 0}
_PLAIN = 'tf.autograph.experimental.do_not_convert'


def _AutoGraphOff(call: ast.Call) -> bool:
  return any(k.arg == 'autograph' and isinstance(k.value, ast.Constant)
             and k.value.value is False for k in call.keywords)


def Problems(source: str, path: str) -> List[str]:
  """'path:line: what' for each place in `source` that would run
  AutoGraph."""
  out = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      out += [f'{path}:{d.lineno}: @tf.function without autograph=False'
              for d in node.decorator_list if ast.unparse(d) == 'tf.function']
    if not isinstance(node, ast.Call):
      continue
    if ast.unparse(node.func) == 'tf.function' and not _AutoGraphOff(node):
      out.append(f'{path}:{node.lineno}: tf.function without '
                 'autograph=False')
    at = (_DATASET_METHODS.get(node.func.attr)
          if isinstance(node.func, ast.Attribute) else None)
    if (at is not None and len(node.args) > at and
        not (isinstance(node.args[at], ast.Call) and
             ast.unparse(node.args[at].func) == _PLAIN)):
      out.append(f'{path}:{node.lineno}: .{node.func.attr}() of a function '
                 f'not wrapped in {_PLAIN}')
  return out


def _RepoRoot() -> str:
  # Not realpath: under Bazel this is the runfiles tree.
  return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class AutoGraphOffTest(absltest.TestCase):

  def testNoAutoGraphInOurCode(self):
    root, problems, files = _RepoRoot(), [], 0
    for top in _ROOTS:
      for folder, _, names in os.walk(os.path.join(root, top)):
        for name in sorted(n for n in names if n.endswith('.py')):
          path = os.path.join(folder, name)
          with open(path, encoding='utf-8') as f:
            problems += Problems(f.read(), os.path.relpath(path, root))
          files += 1
    self.assertGreater(files, 100)  # the tree was found
    self.assertEqual([], problems)

  def testFindsEachKind(self):
    source = '\n'.join([
        'f = tf.function(g)',
        'h = tf.function(g, autograph=True)',
        '@tf.function',
        'def k(x):',
        '  return x',
        'ds = ds.map(lambda x: x)',
        'ds = ds.filter(Keep)',
        'ok = tf.function(g, autograph=False)',
        'ds = ds.map(tf.autograph.experimental.do_not_convert(g))',
        'ds = ds.scan(0, Step)',
        'ds = ds.scan(0, tf.autograph.experimental.do_not_convert(Step))',
    ])
    self.assertEqual([1, 2, 3, 6, 7, 10], sorted(
        int(p.split(':')[1]) for p in Problems(source, 'x.py')))


if __name__ == '__main__':
  absltest.main()
