"""Tests of the optimizers against numpy references, in float64.

Each optimizer runs three steps (different gradients and learning rates)
on a matrix, a vector and, for Adafactor's factoring, a rank-3 tensor;
variables and every slot are compared with a numpy implementation of the
update rule written from the formulas in optimizer.py's docstrings.
"""

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from lingvo_pipe.core import devices

devices.SplitCpu(2)

from lingvo_pipe.core import optimizer  # noqa: E402

_TOL = dict(atol=1e-12, rtol=1e-12)
_SHAPES = {'a/w': (3, 4), 'a/b': (4,), 'c/k': (2, 3, 5)}
_LRS = (0.1, 0.05, 0.2)


def _Rand(shape, seed):
  return np.random.default_rng(seed).normal(size=shape)


# ---- numpy references: step(p, var, g, slots, lr, t) -> var --------------


def _NpSGD(p, var, g, slots, lr, t):
  del p, slots, t
  return var - lr * g


def _NpMomentum(p, var, g, slots, lr, t):
  del t
  accum = p.momentum * slots.get('accum', 0.0) + g
  slots['accum'] = accum
  update = g + p.momentum * accum if p.use_nesterov else accum
  return var - lr * update


def _NpAdam(p, var, g, slots, lr, t):
  m = p.beta1 * slots.get('m', 0.0) + (1 - p.beta1) * g
  v = p.beta2 * slots.get('v', 0.0) + (1 - p.beta2) * g * g
  slots.update(m=m, v=v)
  m_hat = m / (1 - p.beta1**t)
  v_hat = v / (1 - p.beta2**t)
  return var - lr * m_hat / (np.sqrt(v_hat) + p.epsilon)


def _NpRMSProp(p, var, g, slots, lr, t):
  del t
  ms = p.decay * slots.get('ms', 0.0) + (1 - p.decay) * g * g
  slots['ms'] = ms
  update = lr * g / np.sqrt(ms + p.epsilon)
  if p.momentum > 0:
    update = update + p.momentum * slots.get('mom', 0.0)
    slots['mom'] = update
  return var - update


def _NpAdafactor(p, var, g, slots, lr, t):
  beta2 = 1 - t**(-p.decay_exponent)
  g2 = g * g + p.epsilon1
  if p.factored and var.ndim >= 2:
    vr = beta2 * slots.get('vr', 0.0) + (1 - beta2) * g2.mean(-1)
    vc = beta2 * slots.get('vc', 0.0) + (1 - beta2) * g2.mean(-2)
    slots.update(vr=vr, vc=vc)
    v = (vr[..., :, None] * vc[..., None, :] /
         vr.mean(-1)[..., None, None])
  else:
    v = beta2 * slots.get('v', 0.0) + (1 - beta2) * g2
    slots['v'] = v
  u = g / np.sqrt(v)
  if p.clipping_threshold > 0:
    u = u / max(1.0, np.sqrt(np.mean(u * u)) / p.clipping_threshold)
  if p.beta1 > 0:
    u = p.beta1 * slots.get('m', 0.0) + (1 - p.beta1) * u
    slots['m'] = u
  return var - lr * u


_CASES = (
    ('SGD', optimizer.SGD.Params(), _NpSGD),
    ('Momentum', optimizer.Momentum.Params().Set(momentum=0.8), _NpMomentum),
    ('Nesterov', optimizer.Momentum.Params().Set(
        momentum=0.7, use_nesterov=True), _NpMomentum),
    ('Adam', optimizer.Adam.Params().Set(beta1=0.8, beta2=0.9,
                                         epsilon=1e-3), _NpAdam),
    ('RMSProp', optimizer.RMSProp.Params().Set(decay=0.8, epsilon=1e-3),
     _NpRMSProp),
    ('RMSPropMomentum', optimizer.RMSProp.Params().Set(
        decay=0.8, momentum=0.5, epsilon=1e-3), _NpRMSProp),
    ('Adafactor', optimizer.Adafactor.Params(), _NpAdafactor),
    ('AdafactorMomentumClip', optimizer.Adafactor.Params().Set(
        beta1=0.9, clipping_threshold=0.5), _NpAdafactor),
    ('AdafactorUnfactored', optimizer.Adafactor.Params().Set(
        factored=False, clipping_threshold=0.0), _NpAdafactor),
)


def _Variables():
  return {path: tf.Variable(_Rand(shape, i), name=path)
          for i, (path, shape) in enumerate(_SHAPES.items())}


class OptimizerTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      *[(f'{name}_{mode}', params, ref, mode == 'graph')
        for name, params, ref in _CASES for mode in ('eager', 'graph')])
  def testAgainstNumpy(self, params, ref, in_function):
    variables = _Variables()
    opt = params.Copy().Instantiate()
    opt.CreateSlots(variables)

    def Step(lr, grads):
      opt.Apply(lr, [(grads[k], variables[k]) for k in _SHAPES])

    if in_function:
      Step = tf.function(Step, autograph=False)
    np_vars = {k: v.numpy() for k, v in variables.items()}
    np_slots = {k: {} for k in _SHAPES}
    for t, lr in enumerate(_LRS, 1):
      grads = {k: _Rand(s, 10 * t + i)
               for i, (k, s) in enumerate(_SHAPES.items())}
      Step(tf.constant(lr, tf.float32) if in_function else lr,
           {k: tf.constant(g) for k, g in grads.items()})
      for k in _SHAPES:
        np_vars[k] = ref(opt.params, np_vars[k], grads[k], np_slots[k],
                         np.float64(np.float32(lr)) if in_function else lr, t)
    for k in _SHAPES:
      self.assertAllClose(np_vars[k], variables[k].numpy(), **_TOL)
      self.assertCountEqual(np_slots[k], opt.slots[k])
      for name, value in np_slots[k].items():
        self.assertAllClose(value, opt.slots[k][name].numpy(), **_TOL)
    if opt.step is not None:
      self.assertEqual(3, opt.step.numpy())

  def testSlotNamesAndShapes(self):
    variables = _Variables()
    opt = optimizer.Adafactor.Params().Set(beta1=0.9).Instantiate()
    opt.CreateSlots(variables)
    shapes = {k: v.shape.as_list() for k, v in opt.SlotVariables().items()}
    self.assertEqual({
        'optimizer/step': [],
        'a/b/v': [4], 'a/b/m': [4],
        'a/w/vr': [3], 'a/w/vc': [4], 'a/w/m': [3, 4],
        'c/k/vr': [2, 3], 'c/k/vc': [2, 5], 'c/k/m': [2, 3, 5],
    }, shapes)
    adam = optimizer.Adam.Params().Set(name='adam').Instantiate()
    adam.CreateSlots(list(variables.values()))  # keyed by variable names
    self.assertEqual(
        ['a/b/m', 'a/b/v', 'a/w/m', 'a/w/v', 'adam/step', 'c/k/m', 'c/k/v'],
        sorted(adam.SlotVariables()))
    self.assertEmpty(optimizer.SGD.Params().Instantiate().SlotVariables())

  def testCreateSlotsTwiceKeepsSlots(self):
    variables = _Variables()
    opt = optimizer.Momentum.Params().Instantiate()
    opt.CreateSlots(variables)
    accum = opt.slots['a/w']['accum']
    opt.CreateSlots(variables)
    self.assertIs(accum, opt.slots['a/w']['accum'])

  @parameterized.parameters('SGD', 'Momentum', 'Adam', 'RMSProp', 'Adafactor')
  def testSlotsAndUpdatesOnTheVariablesDevice(self, name):
    cpu1 = devices.LogicalDevices('CPU')[1]
    with tf.device(cpu1):
      var = tf.Variable(tf.ones([2, 3], tf.float32), name='x/w')
    opt = getattr(optimizer, name).Params().Instantiate()
    opt.CreateSlots({'x/w': var})
    for slot in opt.slots['x/w'].values():
      self.assertEqual(var.device, slot.device)

    @tf.function(autograph=False)
    def Step(g):
      opt.Apply(0.1, [(g, var)])

    graph = Step.get_concrete_function(
        tf.TensorSpec([2, 3], tf.float32)).graph
    maths = [op for op in graph.get_operations()
             if op.type in ('Mul', 'AddV2', 'Sub', 'RealDiv', 'Sqrt', 'Rsqrt',
                            'AssignSubVariableOp', 'AssignVariableOp')
             and not op.name.startswith('step')]  # the step counter
    self.assertNotEmpty(maths)
    for op in maths:
      self.assertEqual(var.device, op.device, op.name)

  def testNoneGradientLeavesVariableAndSlots(self):
    variables = _Variables()
    opt = optimizer.Adam.Params().Instantiate()
    opt.CreateSlots(variables)
    before = variables['a/b'].numpy()
    opt.Apply(0.1, [(None, variables['a/b']),
                    (tf.ones([3, 4], tf.float64), variables['a/w'])])
    self.assertAllEqual(before, variables['a/b'].numpy())
    self.assertAllEqual(np.zeros(4), opt.slots['a/b']['m'].numpy())
    self.assertNotAllClose(np.zeros([3, 4]), opt.slots['a/w']['m'].numpy())

  def testIndexedSlicesGradientIsDensified(self):
    var = tf.Variable(tf.zeros([4, 2], tf.float64), name='emb')
    opt = optimizer.SGD.Params().Instantiate()
    opt.CreateSlots([var])
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.gather(var, [1, 1, 3]))
    grad = tape.gradient(loss, var)
    self.assertIsInstance(grad, tf.IndexedSlices)
    opt.Apply(0.5, [(grad, var)])
    self.assertAllEqual([[0, 0], [-1, -1], [0, 0], [-0.5, -0.5]],
                        var.numpy())

  def testErrors(self):
    var = tf.Variable(tf.zeros([2]), name='v')
    opt = optimizer.SGD.Params().Instantiate()
    with self.assertRaisesRegex(ValueError, 'has no slots.*CreateSlots'):
      opt.Apply(0.1, [(tf.ones([2]), var)])
    with self.assertRaisesRegex(ValueError, r'momentum=1.5 must be in'):
      optimizer.Momentum.Params().Set(momentum=1.5).Instantiate()
    with self.assertRaisesRegex(ValueError, r'beta2=-0.1 must be in'):
      optimizer.Adam.Params().Set(beta2=-0.1).Instantiate()
    with self.assertRaisesRegex(ValueError, "without '/'"):
      optimizer.Adam.Params().Set(name='a/b').Instantiate()

    @tf.function(autograph=False)
    def Create():
      opt.CreateSlots([var])

    with self.assertRaisesRegex(RuntimeError, 'must run eagerly'):
      Create()


if __name__ == '__main__':
  absltest.main()
