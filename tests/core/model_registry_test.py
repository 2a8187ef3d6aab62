"""model_registry: keys, duplicates, lookups, a user's module."""

import os
import sys
import textwrap

from absl.testing import absltest

from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import model_registry


def _Input(batch):
  p = hyperparams.Params()
  p.Define('batch_size', batch, 'Batch size.')
  return p


class _Task:

  @classmethod
  def Params(cls):
    p = hyperparams.InstantiableParams(cls)
    p.Define('name', '', 'Name.')
    p.Define('dim', 3, 'Width.')
    return p


class RegistryTest(absltest.TestCase):

  def _Define(self, name, module, with_dev=True):
    def Task(self):
      return _Task.Params()

    def Train(self):
      return _Input(8)

    def Dev(self):
      return _Input(4)

    methods = {'Task': Task, 'Train': Train}
    if with_dev:
      methods['Dev'] = Dev
    cls = type(name, (), methods)
    cls.__module__ = module
    return cls

  def testKeyFromModulePathBelowParams(self):
    cls = self._Define('Small', 'params.testing_zone.mod')
    model_registry.RegisterSingleTaskModel(cls)
    self.assertIs(model_registry.GetClass('testing_zone.mod.Small'), cls)
    p = model_registry.GetParams('testing_zone.mod.Small')
    self.assertEqual(p.task.dim, 3)
    self.assertEqual(p.task.name, 'Small')
    self.assertEqual(p.train_input.batch_size, 8)
    self.assertEqual(p.dev_input.batch_size, 4)
    self.assertIsNone(p.test_input)

  def testOutsideParamsTheFullModulePathIsTheKey(self):
    cls = self._Define('Mine', 'my_zone.models', with_dev=False)
    model_registry.RegisterSingleTaskModel(cls)
    self.assertIs(model_registry.GetClass('my_zone.models.Mine'), cls)
    self.assertIsNone(model_registry.GetParams('my_zone.models.Mine').dev_input)

  def testDuplicateKeyIsAnError(self):
    model_registry.RegisterSingleTaskModel(self._Define('Dup', 'dup_zone.m'))
    with self.assertRaisesRegex(ValueError, "'dup_zone.m.Dup' is registered "
                                'twice'):
      model_registry.RegisterSingleTaskModel(self._Define('Dup', 'dup_zone.m'))

  def testRegisteringTheSameClassAgainIsHarmless(self):
    cls = self._Define('Again', 'again_zone.m')
    model_registry.RegisterSingleTaskModel(cls)
    model_registry.RegisterSingleTaskModel(cls)
    self.assertIs(model_registry.GetClass('again_zone.m.Again'), cls)

  def testMissingMethodsAreAnError(self):
    cls = type('NoTask', (), {'Train': lambda self: None})
    with self.assertRaisesRegex(TypeError, r'has no Task\(\) method'):
      model_registry.RegisterSingleTaskModel(cls)

  def testUnknownKeyNamesTheClosestModels(self):
    model_registry.RegisterSingleTaskModel(
        self._Define('Closest', 'near_zone.models'))
    with self.assertRaisesRegex(
        LookupError, r"Unknown model 'near_zone.models.Closet'; did you mean "
        r"'near_zone.models.Closest'"):
      model_registry.GetClass('near_zone.models.Closet')

  def testUnknownKeyWithNothingCloseListsModels(self):
    with self.assertRaisesRegex(LookupError, 'registered models: '):
      model_registry.GetClass('qqqqqqqqqqqqqqqqq.zzzzzzz')

  def testAUserModuleIsImportedByItsKey(self):
    root = self.create_tempdir().full_path
    os.makedirs(os.path.join(root, 'user_pkg_for_test'))
    open(os.path.join(root, 'user_pkg_for_test', '__init__.py'), 'w').close()
    with open(os.path.join(root, 'user_pkg_for_test', 'models.py'), 'w') as f:
      f.write(textwrap.dedent('''
          from lingvo_pipe.core import hyperparams
          from lingvo_pipe.core import model_registry

          @model_registry.RegisterSingleTaskModel
          class UserParams:
            def Task(self):
              p = hyperparams.Params()
              p.Define('name', '', 'Name.')
              p.Define('answer', 42, 'The answer.')
              return p

            def Train(self):
              return None
          '''))
    sys.path.insert(0, root)
    self.addCleanup(sys.path.remove, root)
    p = model_registry.GetParams('user_pkg_for_test.models.UserParams')
    self.assertEqual(p.task.answer, 42)

  def testAnErrorInsideAUserModuleIsNotHidden(self):
    root = self.create_tempdir().full_path
    with open(os.path.join(root, 'broken_user_mod.py'), 'w') as f:
      f.write('import this_module_does_not_exist_anywhere\n')
    sys.path.insert(0, root)
    self.addCleanup(sys.path.remove, root)
    with self.assertRaisesRegex(ModuleNotFoundError,
                                'this_module_does_not_exist_anywhere'):
      model_registry.GetClass('broken_user_mod.Model')


if __name__ == '__main__':
  absltest.main()
