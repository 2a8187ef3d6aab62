"""Checks that the Bazel BUILD files cover every Python file, by convention.

The convention (also at the top of lingvo_pipe/core/BUILD):

- Every directory with .py files under lingvo_pipe/, params/ and tests/ is
  a Bazel package: it has a BUILD file.
- `x.py` has `py_library(name = "x", srcs = ["x.py"], srcs_version = "PY3",
  deps = [...])` (or a py_binary of that name).
- `x_test.py` has `py_test(name = "x_test", srcs = ["x_test.py"],
  main = "x_test.py", python_version = "PY3", srcs_version = "PY3", ...)`.
- `__init__.py` has `py_library(name = "__init__", srcs = ["__init__.py"])`
  that depends on the parent package's "__init__" (if it has one), and every
  other target of that package depends on ":__init__". An __init__.py
  imports no first-party module (that would be a dependency cycle).
- Every first-party import (lingvo_pipe, params, tests) is a direct dep.
  Bazel would not catch a missing one: the venv's editable install of
  lingvo_pipe makes the module importable anyway.
- A package may have `py_library(name = "all_modules", deps = [...])` for
  code that finds its modules at run time (pkgutil, as the registered-model
  tests do over params/): then its deps list every module of the package.
- Each package has `filegroup(name = "build_check_files")` with its BUILD
  and .py files, listed in the data of //tests:bazel_build_test, so this
  test sees the same files under Bazel (in the runfiles) as under pytest
  (in the source tree).

tests/conftest.py is pytest-only and needs no target.
"""

import ast
import os
import shutil
import tempfile
from typing import Dict, List, NamedTuple, Optional, Tuple

from absl.testing import absltest

_ROOTS = ('lingvo_pipe', 'params', 'tests')
_PYTEST_ONLY = ('conftest.py',)
_PY_RULES = ('py_library', 'py_binary', 'py_test')
_CHECK_FILEGROUP = 'build_check_files'
_CHECK_TEST = ('tests', 'bazel_build_test')
_ALL_MODULES = 'all_modules'

Label = Tuple[str, str]  # (package path, target name)


class Target(NamedTuple):
  kind: str
  name: str
  # Keyword arguments that are literals; other values (e.g. glob()) are None.
  attrs: Dict[str, object]


def ParseBuild(text: str) -> Dict[str, Target]:
  """Top-level rule calls of a BUILD file, by name (Starlark is Python)."""
  targets = {}
  for node in ast.parse(text).body:
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)):
      continue
    attrs = {}
    for kw in node.value.keywords:
      if kw.arg is None:
        continue
      try:
        attrs[kw.arg] = ast.literal_eval(kw.value)
      except ValueError:
        attrs[kw.arg] = None
    name = attrs.get('name')
    if isinstance(name, str):
      if name in targets:
        raise ValueError('two targets named "%s"' % name)
      targets[name] = Target(node.value.func.id, name, attrs)
  return targets


def ParseLabel(label: str, package: str) -> Optional[Label]:
  """'//a/b:c', '//a/b', ':c' or 'c' seen from `package`; None if external."""
  if label.startswith('@'):
    return None
  if label.startswith('//'):
    pkg, _, name = label[2:].partition(':')
    return (pkg, name or pkg.rsplit('/', 1)[-1])
  return (package, label.lstrip(':'))


def FormatLabel(label: Label, package: str) -> str:
  return ':' + label[1] if label[0] == package else '//%s:%s' % label


class Checker:
  """Finds the convention's violations in the tree under `root`."""

  def __init__(self, root: str):
    self._root = root
    self.py_files = {}  # package dir -> sorted .py file names
    self.builds = {}  # package dir -> {name: Target}
    self.bad_builds = []  # BUILD files that ParseBuild rejects
    for top in _ROOTS:
      for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
        dirnames[:] = sorted(d for d in dirnames
                             if not d.startswith(('.', '__pycache__')))
        rel = os.path.relpath(dirpath, root).replace(os.sep, '/')
        pys = sorted(f for f in filenames
                     if f.endswith('.py') and f not in _PYTEST_ONLY)
        if pys:
          self.py_files[rel] = pys
        if 'BUILD' in filenames:
          with open(os.path.join(dirpath, 'BUILD')) as f:
            try:
              self.builds[rel] = ParseBuild(f.read())
            except (SyntaxError, ValueError) as e:
              self.bad_builds.append('%s/BUILD: %s' % (rel, e))
              self.builds[rel] = {}

  def _Exists(self, path: str) -> bool:
    return os.path.isfile(os.path.join(self._root, path))

  def _ModuleLabel(self, dotted: str) -> Optional[Label]:
    path = dotted.replace('.', '/')
    if self._Exists(path + '.py'):
      pkg, _, name = path.rpartition('/')
      return (pkg, name)
    if self._Exists(path + '/__init__.py'):
      return (path, '__init__')
    return None

  def _ImportLabels(self, package: str, filename: str) -> List[Label]:
    """Targets of the first-party modules that `package/filename` imports."""
    with open(os.path.join(self._root, package, filename)) as f:
      tree = ast.parse(f.read(), filename)
    labels = []
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        candidates = [[a.name] for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ''
        if node.level:
          parts = package.split('/')[:len(package.split('/')) - node.level + 1]
          base = '.'.join(parts + ([base] if base else []))
        # `from m import n`: n is a module, or else a name defined in m.
        candidates = [[base + '.' + a.name, base] for a in node.names]
      else:
        continue
      for names in candidates:
        if names[0].split('.')[0] not in _ROOTS:
          continue
        for name in names:
          label = self._ModuleLabel(name)
          if label:
            labels.append(label)
            break
    return labels

  def _PyTargets(self, package: str) -> List[Target]:
    return [t for t in self.builds.get(package, {}).values()
            if t.kind in _PY_RULES]

  def MissingBuildFiles(self) -> List[str]:
    return self.bad_builds + ['%s/ has .py files but no BUILD file' % p
                              for p in self.py_files if p not in self.builds]

  def MissingTargets(self) -> List[str]:
    """Each x.py / x_test.py needs its py_library / py_test as convened."""
    problems = []
    for package, files in self.py_files.items():
      targets = self.builds.get(package)
      if targets is None:
        continue
      for filename in files:
        name = filename[:-3]
        if name.endswith('_test'):
          want = {'srcs': [filename], 'main': filename,
                  'python_version': 'PY3', 'srcs_version': 'PY3'}
          kinds = ('py_test',)
        else:
          want = {'srcs': [filename], 'srcs_version': 'PY3'}
          kinds = ('py_library', 'py_binary')
        target = targets.get(name)
        if target is None or target.kind not in kinds:
          problems.append('%s/BUILD: no %s(name = "%s") for %s; add\n%s' %
                          (package, kinds[0], name, filename,
                           self._Suggest(package, kinds[0], name, want)))
          continue
        for attr, value in want.items():
          if target.attrs.get(attr) != value:
            problems.append('%s/BUILD: %s needs %s = %r, has %r' %
                            (package, name, attr, value,
                             target.attrs.get(attr)))
    return problems

  def _Suggest(self, package: str, kind: str, name: str,
               attrs: Dict[str, object]) -> str:
    """A BUILD stanza for `name`, with its deps taken from its imports."""
    deps = set(self._ImportLabels(package, name + '.py'))
    init = package.rpartition('/')[0] if name == '__init__' else package
    if init and self._Exists(init + '/__init__.py'):
      deps.add((init, '__init__'))
    deps.discard((package, name))
    lines = ['%s(' % kind, '    name = "%s",' % name]
    for attr, value in attrs.items():
      value = '["%s"]' % value[0] if isinstance(value, list) else '"%s"' % value
      lines.append('    %s = %s,' % (attr, value))
    labels = sorted((FormatLabel(d, package) for d in deps),
                    key=lambda label: (label.startswith('//'), label))
    if len(labels) == 1:
      lines.append('    deps = ["%s"],' % labels[0])
    elif labels:
      lines.append('    deps = [')
      lines.extend('        "%s",' % label for label in labels)
      lines.append('    ],')
    return '\n'.join(lines + [')'])

  def _Deps(self, package: str, target: Target) -> List[Label]:
    deps = target.attrs.get('deps') or []
    return [d for d in (ParseLabel(x, package) for x in deps) if d]

  def MissingInitDeps(self) -> List[str]:
    """__init__ chains to the parent's; other targets depend on :__init__."""
    problems = []
    for package in self.builds:
      if not self._Exists(package + '/__init__.py'):
        continue
      for target in self._PyTargets(package):
        if target.name == '__init__':
          parent = package.rpartition('/')[0]
          if parent and self._Exists(parent + '/__init__.py'):
            want = (parent, '__init__')
          else:
            continue
        else:
          want = (package, '__init__')
        if want not in self._Deps(package, target):
          problems.append('%s/BUILD: %s needs "%s" in deps' %
                          (package, target.name, FormatLabel(want, package)))
    return problems

  def MissingImportDeps(self) -> List[str]:
    """Every first-party import of a file is a direct dep of its target."""
    problems = []
    for package, files in self.py_files.items():
      targets = self.builds.get(package, {})
      for filename in files:
        target = targets.get(filename[:-3])
        if target is None or target.kind not in _PY_RULES:
          continue  # Reported by MissingTargets.
        deps = self._Deps(package, target)
        for label in self._ImportLabels(package, filename):
          if label == (package, target.name):
            continue
          if target.name == '__init__':
            problems.append(
                '%s/__init__.py imports %s: keep __init__.py free of '
                'first-party imports (the ":__init__" deps would form a '
                'cycle)' % (package, FormatLabel(label, package)))
          elif label not in deps:
            problems.append('%s/BUILD: add "%s" to the deps of %s (%s '
                            'imports it)' % (package,
                                             FormatLabel(label, package),
                                             target.name, filename))
    return sorted(set(problems))

  def IncompleteAllModules(self) -> List[str]:
    """An "all_modules" target depends on every module of its package."""
    problems = []
    for package, targets in self.builds.items():
      everything = targets.get(_ALL_MODULES)
      if everything is None:
        continue
      deps = self._Deps(package, everything)
      for filename in self.py_files.get(package, []):
        label = (package, filename[:-3])
        if label[1] not in ('__init__', _ALL_MODULES) and label not in deps:
          problems.append('%s/BUILD: add ":%s" to the deps of %s' %
                          (package, label[1], _ALL_MODULES))
    return problems

  def UncheckedPackages(self) -> List[str]:
    """Each package's build_check_files is data of this very test."""
    test = self.builds.get(_CHECK_TEST[0], {}).get(_CHECK_TEST[1])
    data = test.attrs.get('data') if test else None
    if not isinstance(data, list):
      return ['%s/BUILD: needs py_test(name = "%s", data = [...]) with a '
              'literal list' % _CHECK_TEST]
    seen = {ParseLabel(x, _CHECK_TEST[0]) for x in data}
    problems = []
    for package, targets in self.builds.items():
      if targets.get(_CHECK_FILEGROUP, Target('', '', {})).kind != 'filegroup':
        problems.append('%s/BUILD: needs filegroup(name = "%s")' %
                        (package, _CHECK_FILEGROUP))
      if (package, _CHECK_FILEGROUP) not in seen:
        problems.append('%s/BUILD: %s needs "//%s:%s" in data' %
                        (_CHECK_TEST + (package, _CHECK_FILEGROUP)))
    return problems


def _RepoRoot() -> str:
  # Not realpath: under Bazel this is the runfiles tree, which holds exactly
  # the files of the build_check_files filegroups.
  return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class RepoBuildFilesTest(absltest.TestCase):
  """The repository's BUILD files follow the convention."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.checker = Checker(_RepoRoot())

  def _AssertNone(self, problems: List[str]) -> None:
    if problems:
      self.fail('BUILD files break the convention (see lingvo_pipe/core/BUILD)'
                ':\n' + '\n'.join(problems))

  def testSeesTheTree(self):
    # Guards against a wrong root, which would make every check vacuous.
    self.assertIn('__init__.py', self.checker.py_files.get('lingvo_pipe', []))
    self.assertIn('bazel_build_test.py', self.checker.py_files.get('tests'))
    self.assertIn('lingvo_pipe/core', self.checker.builds)

  def testEveryPythonDirectoryIsAPackage(self):
    self._AssertNone(self.checker.MissingBuildFiles())

  def testEveryModuleAndTestHasATarget(self):
    self._AssertNone(self.checker.MissingTargets())

  def testInitDeps(self):
    self._AssertNone(self.checker.MissingInitDeps())

  def testFirstPartyImportsAreDirectDeps(self):
    self._AssertNone(self.checker.MissingImportDeps())

  def testAllModulesTargetsAreComplete(self):
    self._AssertNone(self.checker.IncompleteAllModules())

  def testThisTestSeesEveryPackage(self):
    self._AssertNone(self.checker.UncheckedPackages())


_GOOD_TREE = {
    'lingvo_pipe/__init__.py': '',
    'lingvo_pipe/a.py': 'from lingvo_pipe import b\n',
    'lingvo_pipe/b.py': 'import os\n',
    'lingvo_pipe/BUILD': '''
py_library(name = "__init__", srcs = ["__init__.py"], srcs_version = "PY3")
py_library(
    name = "a",
    srcs = ["a.py"],
    srcs_version = "PY3",
    deps = [":__init__", ":b"],
)
py_library(
    name = "b",
    srcs = ["b.py"],
    srcs_version = "PY3",
    deps = [":__init__"],
)
filegroup(name = "build_check_files", srcs = ["BUILD"] + glob(["*.py"]))
''',
    'tests/a_test.py': 'from lingvo_pipe.a import X\n',
    'tests/BUILD': '''
py_test(
    name = "a_test",
    srcs = ["a_test.py"],
    main = "a_test.py",
    python_version = "PY3",
    srcs_version = "PY3",
    deps = ["//lingvo_pipe:a"],
)
py_test(
    name = "bazel_build_test",
    srcs = ["bazel_build_test.py"],
    main = "bazel_build_test.py",
    python_version = "PY3",
    srcs_version = "PY3",
    data = [":build_check_files", "//lingvo_pipe:build_check_files"],
)
filegroup(name = "build_check_files", srcs = glob(["*.py"]))
''',
    'tests/bazel_build_test.py': '',
}


class CheckerTest(absltest.TestCase):
  """The checker finds each kind of violation in a small synthetic tree."""

  def _Check(self, edits: Dict[str, Optional[str]]) -> List[str]:
    root = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, root)
    tree = dict(_GOOD_TREE)
    tree.update(edits)
    for path, text in tree.items():
      if text is None:
        continue
      os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
      with open(os.path.join(root, path), 'w') as f:
        f.write(text)
    checker = Checker(root)
    return (checker.MissingBuildFiles() + checker.MissingTargets() +
            checker.MissingInitDeps() + checker.MissingImportDeps() +
            checker.IncompleteAllModules() + checker.UncheckedPackages())

  def _Edit(self, path: str, old: str, new: str) -> Dict[str, str]:
    self.assertIn(old, _GOOD_TREE[path])
    return {path: _GOOD_TREE[path].replace(old, new)}

  def testGoodTreePasses(self):
    self.assertEqual([], self._Check({}))

  def testNewModuleWithoutLibrary(self):
    self.assertEqual(['lingvo_pipe/BUILD: no py_library(name = "c") for c.py; '
                      'add\n'
                      'py_library(\n'
                      '    name = "c",\n'
                      '    srcs = ["c.py"],\n'
                      '    srcs_version = "PY3",\n'
                      '    deps = [\n'
                      '        ":__init__",\n'
                      '        ":a",\n'
                      '    ],\n'
                      ')'],
                     self._Check({'lingvo_pipe/c.py': 'import lingvo_pipe.a'}))

  def testNewTestWithoutPyTest(self):
    self.assertEqual(['tests/BUILD: no py_test(name = "b_test") for '
                      'b_test.py; add\n'
                      'py_test(\n'
                      '    name = "b_test",\n'
                      '    srcs = ["b_test.py"],\n'
                      '    main = "b_test.py",\n'
                      '    python_version = "PY3",\n'
                      '    srcs_version = "PY3",\n'
                      '    deps = ["//lingvo_pipe:b"],\n'
                      ')'],
                     self._Check({'tests/b_test.py':
                                  'from lingvo_pipe import b\n'}))

  def testPyTestWithoutMain(self):
    self.assertEqual(["tests/BUILD: a_test needs main = 'a_test.py', has None"],
                     self._Check(self._Edit('tests/BUILD',
                                            'main = "a_test.py",', '')))

  def testMissingImportDep(self):
    self.assertEqual(['lingvo_pipe/BUILD: add ":b" to the deps of a (a.py '
                      'imports it)'],
                     self._Check(self._Edit('lingvo_pipe/BUILD',
                                            ', ":b"]', ']')))

  def testImportOfAModuleInAnotherPackage(self):
    self.assertEqual(
        ['tests/BUILD: add "//lingvo_pipe:a" to the deps of a_test '
         '(a_test.py imports it)'],
        self._Check(self._Edit('tests/BUILD', '"//lingvo_pipe:a"', '')))

  def testMissingInitDep(self):
    self.assertEqual(['lingvo_pipe/BUILD: b needs ":__init__" in deps'],
                     self._Check(self._Edit('lingvo_pipe/BUILD',
                                            'deps = [":__init__"],', '')))

  def testTwoTargetsWithOneName(self):
    problems = self._Check(self._Edit('lingvo_pipe/BUILD', 'filegroup(',
                                      'py_library(name = "b")\nfilegroup('))
    self.assertEqual('lingvo_pipe/BUILD: two targets named "b"', problems[0])

  def testDirectoryWithoutBuild(self):
    self.assertEqual(['lingvo_pipe/sub/ has .py files but no BUILD file'],
                     self._Check({'lingvo_pipe/sub/__init__.py': ''}))

  def testAllModulesMissesOne(self):
    edit = self._Edit('lingvo_pipe/BUILD', 'filegroup(',
                      'py_library(name = "all_modules",\n'
                      '           deps = [":__init__", ":a"])\n'
                      'filegroup(')
    self.assertEqual(['lingvo_pipe/BUILD: add ":b" to the deps of '
                      'all_modules'], self._Check(edit))

  def testPackageNotInCheckerData(self):
    problems = self._Check(self._Edit(
        'tests/BUILD', ', "//lingvo_pipe:build_check_files"', ''))
    self.assertEqual(['tests/BUILD: bazel_build_test needs '
                      '"//lingvo_pipe:build_check_files" in data'], problems)


if __name__ == '__main__':
  absltest.main()
