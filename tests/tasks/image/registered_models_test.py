"""Every registered image model's full-size params build and are consistent.

tiny_models_test.py trains a tiny version of each for one step.
"""

import re

from absl.testing import absltest
from absl.testing import parameterized

from lingvo_pipe.core import devices

devices.SplitCpu(4)

from lingvo_pipe.core import base_layer  # noqa: E402
from lingvo_pipe.core import base_model  # noqa: E402
from lingvo_pipe.core import gpipe  # noqa: E402
from lingvo_pipe.core import model_registry  # noqa: E402
from lingvo_pipe.tasks.image import model  # noqa: E402

KEYS = ('image.cifar10.AmoebaNetD_GPipe', 'image.cifar10.ResNet_GPipe',
        'image.cifar100.AmoebaNetD_GPipe', 'image.cifar100.ResNet50_FineTune',
        'image.folder.AmoebaNetDFolder', 'image.folder.AmoebaNetTinyFolder',
        'image.folder.ResNetFolder', 'image.folder.ResNetTinyFolder',
        'image.imagenet.AmoebaNetB_18_512_GPipe',
        'image.imagenet.AmoebaNetD_18_208',
        'image.imagenet.AmoebaNetD_18_544_GPipe',
        'image.imagenet.AmoebaNetD_36_544_GPipe',
        'image.imagenet.ResNet50_GPipe',
        'image.synthetic.AmoebaNetTinyGPipe',
        'image.synthetic.ResNetTinyGPipe')


class RegisteredImageModelsTest(parameterized.TestCase):

  def testEveryImageModelIsTested(self):
    self.assertEqual(list(KEYS), [k for k in model_registry.ModelNames()
                                  if k.startswith('image.')])

  @parameterized.parameters(*KEYS)
  def testFullSizeParams(self, key):
    p = model_registry.GetParams(key)
    cls = model_registry.GetClass(key)
    self.assertIs(p.task.cls, model.ImageClassifier)
    self.assertIs(p.task.network.cls, gpipe.PipeliningLayer)
    self.assertGreaterEqual(cls.NUM_PARTITIONS, 1)
    self.assertEqual(cls.NUM_PARTITIONS, base_model.NumDevicesNeeded(p.task))
    m = p.task.network.num_micro_batches
    self.assertEqual(cls.NUM_MICRO_BATCHES, m)
    self.assertEqual(0, p.train_input.batch_size % m)
    self.assertEqual(0, p.dev_input.batch_size % m)
    self.assertTrue(p.train_input.repeat)
    self.assertFalse(p.dev_input.repeat)
    self.assertEqual(p.task.num_classes, p.train_input.num_classes)
    names = [sub.name for cell in p.task.network.cell_tpl
             for sub in cell.sub]
    self.assertEqual('stem', names[0])
    self.assertIn(names[-1], ('logits', 'head'))
    # Params text round-trips (the trainer writes it to params.txt).
    self.assertEqual(p.ToText(), p.Copy().FromText(p.ToText()).ToText())

  # The paper's AmoebaNets (Table 1 and its 557M ImageNet model), by the
  # registered partitions' variable shapes (nothing allocated; K=8 needs
  # more devices than the test has): parameters, K, M, image size.
  @parameterized.parameters(
      ('AmoebaNetD_18_208', 82e6, 1, 1, 224),
      ('AmoebaNetD_18_544_GPipe', 542e6, 4, 32, 224),
      ('AmoebaNetD_36_544_GPipe', 1.05e9, 8, 32, 224),
      ('AmoebaNetB_18_512_GPipe', 557e6, 4, 32, 480))
  def testImageNetAmoebaNets(self, name, paper, k, m, image_size):
    p = model_registry.GetParams(f'image.imagenet.{name}')
    self.assertEqual(k, len(p.task.network.cell_tpl))
    self.assertEqual(m, p.task.network.num_micro_batches)
    self.assertEqual(image_size, p.train_input.image_size)
    with base_layer.VariableShapesOnly():  # each partition's layers
      count = sum(base_layer.NumParameters(cell.Copy().Set(
          name=f'cell{i}').Instantiate()) for i, cell in enumerate(
              p.task.network.cell_tpl))
    self.assertLess(abs(count - paper) / paper, 0.03)
    if k == 1:
      self.assertEqual('never', p.task.network.recompute)

  def testFineTuningFindsTheImageNetModelsVariables(self):
    """Same names and shapes but the classifier's: the rules can load."""

    def Shapes(key):
      p = model_registry.GetParams(key).task.Set(name='task')
      with base_layer.VariableShapesOnly():
        task = p.Instantiate()
      return {n: v.shape.as_list() for n, v in task.VariablesByPath().items()}

    pretrained = Shapes('image.imagenet.ResNet50_GPipe')
    tuned = Shapes('image.cifar100.ResNet50_FineTune')
    rules = model_registry.GetParams(
        'image.cifar100.ResNet50_FineTune').task.train.init_from_checkpoint_rules
    (_, (_, ignores)), = rules.items()
    head = {n for n in tuned if any(re.match(r, n) for r in ignores)}
    self.assertEqual({'task/network/logits/w', 'task/network/logits/b'},
                     head)
    self.assertEqual({n: s for n, s in pretrained.items() if n not in head},
                     {n: s for n, s in tuned.items() if n not in head})


if __name__ == '__main__':
  absltest.main()
