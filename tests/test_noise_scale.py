"""The gradient noise scale: the towers' estimates against brute force."""

import numpy as np
import pytest
import tensorflow as tf

import cifar10_multi_gpu_train as multi
import cifar10_replicated
from conftest import build_towers
from machinery import hardware
from machinery import noise_scale

tf1 = tf.compat.v1

EXAMPLES = 64  # M: the examples every estimate here is made from.


def _examples(seed=0):
  """M images of 10 classes, each its class's pattern under noise: data
  with a true gradient to find (on pure noise |G|^2 is about 0)."""
  rng = np.random.RandomState(seed)
  patterns = rng.normal(size=(10, 24, 24, 3))
  labels = rng.randint(0, 10, size=EXAMPLES)
  images = patterns[labels] + 0.5 * rng.normal(size=(EXAMPLES, 24, 24, 3))
  return images.astype(np.float32), labels.astype(np.int32)


def _flat(sess, grads, feed):
  """The gradients of (gradient, variable) pairs as one numpy vector."""
  return np.concatenate([g.ravel() for g in sess.run(
      [g for g, _ in grads], feed)]).astype(np.float64)


class _Model(object):
  """The model on shared variables, at fixed (initial) parameters: towers
  of any count on a fed batch, and one example's gradient."""

  def __init__(self, tower_counts):
    self.images = tf1.placeholder(tf.float32, [EXAMPLES, 24, 24, 3])
    self.labels = tf1.placeholder(tf.int32, [EXAMPLES])
    opt = tf1.train.GradientDescentOptimizer(0.1)
    self.estimates = {}
    with tf1.variable_scope(tf1.get_variable_scope(), reuse=tf1.AUTO_REUSE):
      for n in tower_counts:
        size = EXAMPLES // n
        tower_grads = []
        for i in range(n):
          with tf1.name_scope('n%d_tower_%d' % (n, i)) as scope:
            loss = multi.tower_loss(
                scope, self.images[i * size:(i + 1) * size],
                self.labels[i * size:(i + 1) * size])
            tower_grads.append(opt.compute_gradients(loss))
        self.estimates[n] = noise_scale.estimate(
            tower_grads, multi.average_gradients(tower_grads), size)
      with tf1.name_scope('one_example') as scope:
        self.image = tf1.placeholder(tf.float32, [1, 24, 24, 3])
        self.label = tf1.placeholder(tf.int32, [1])
        self.example_grads = opt.compute_gradients(
            multi.tower_loss(scope, self.image, self.label))

  def per_example(self, sess, images, labels):
    """Each example's gradient (cross entropy plus weight decay): [M, P]."""
    return np.stack([_flat(sess, self.example_grads, {
        self.image: images[j:j + 1], self.label: labels[j:j + 1]})
                     for j in range(EXAMPLES)])

  def estimate(self, sess, n, images, labels):
    return sess.run(self.estimates[n], {self.images: images,
                                        self.labels: labels})


def test_towers_squared_norms_and_estimates_are_the_formulas():
  images, labels = _examples()
  with tf.Graph().as_default():
    tf1.set_random_seed(1)
    model = _Model([4])
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      g = model.per_example(sess, images, labels)
      got = model.estimate(sess, 4, images, labels)
  # By hand: tower i's gradient is the mean of its 16 examples'; the
  # towers' mean, that of all 64.
  small = np.mean([np.sum(g[i * 16:(i + 1) * 16].mean(axis=0) ** 2)
                   for i in range(4)])
  big = np.sum(g.mean(axis=0) ** 2)
  # float32 sums over a million parameters: a few parts in 1e5.
  np.testing.assert_allclose(got.small_squared, small, rtol=1e-4)
  np.testing.assert_allclose(got.big_squared, big, rtol=1e-4)
  np.testing.assert_allclose(got.gradient_squared,
                             (64 * big - 16 * small) / 48, rtol=1e-3)
  np.testing.assert_allclose(got.trace_sigma,
                             (small - big) / (1 / 16 - 1 / 64), rtol=1e-3)


def test_estimates_from_2_4_8_towers_agree_with_brute_force():
  """Over random splits of the same 64 examples into towers, the estimates
  are unbiased: E |G_b|^2 = |G_M|^2 + S^2 (1/b - 1/M) for b of M examples
  drawn without replacement, S^2 the per-example gradients' variance (over
  M - 1), so E tr(Sigma) = S^2 and E |G|^2 = |G_M|^2 - S^2 / M, whatever
  the number of towers. Their means over 40 splits stand within 4 standard
  errors of those values (a fixed seed: one draw, which a wrong formula,
  off by a factor of the tower count, would miss by far more)."""
  images, labels = _examples()
  rng = np.random.RandomState(7)
  with tf.Graph().as_default():
    tf1.set_random_seed(1)
    model = _Model([2, 4, 8])
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      g = model.per_example(sess, images, labels)
      draws = {n: [] for n in (2, 4, 8)}
      for _ in range(40):
        order = rng.permutation(EXAMPLES)
        for n in draws:
          draws[n].append(model.estimate(sess, n, images[order],
                                         labels[order]))
  mean = g.mean(axis=0)
  s2 = np.sum((g - mean) ** 2) / (EXAMPLES - 1)
  truth = {'trace_sigma': s2,
           'gradient_squared': np.sum(mean ** 2) - s2 / EXAMPLES}
  for n, estimates in draws.items():
    for field, want in truth.items():
      values = np.array([getattr(e, field) for e in estimates])
      error = values.std(ddof=1) / np.sqrt(len(values))
      assert error < 0.2 * want, (n, field)  # The bound means something.
      assert abs(values.mean() - want) < 4 * error, (n, field, values.mean(),
                                                     want, error)
  # The noise scale itself, from the means: one value for every count.
  ratios = [np.mean([e.trace_sigma for e in draws[n]]) /
            np.mean([e.gradient_squared for e in draws[n]]) for n in draws]
  want = truth['trace_sigma'] / truth['gradient_squared']
  assert max(abs(r - want) / want for r in ratios) < 0.25, (ratios, want)


def _batches(n):
  rng = np.random.RandomState(n)
  return [(tf.constant(rng.normal(size=(8, 24, 24, 3)).astype(np.float32)),
           tf.constant(rng.randint(0, 10, size=8).astype(np.int32)))
          for _ in range(n)]


def _summaries(graph):
  return sorted(
      s.op.inputs[0].op.get_attr('value').string_val[0].decode()
      for s in graph.get_collection(tf1.GraphKeys.SUMMARIES)
      if s.op.type == 'ScalarSummary' and s.op.name.startswith(
          noise_scale.TAG))


@pytest.mark.parametrize('variable_update', [
    cifar10_replicated.PARAMETER_SERVER, cifar10_replicated.REPLICATED])
def test_towers_summarize_it_and_save_none_of_it(variable_update):
  devices, config = hardware.tower_devices(2, virtual=True)
  with tf.Graph().as_default() as graph:
    train_op, _, scaffold = build_towers(_batches(2), devices,
                                         variable_update)
    assert _summaries(graph) == [noise_scale.TAG,
                                 noise_scale.TAG + '/gradient_squared',
                                 noise_scale.TAG + '/trace_sigma']
    assert not [v for v in tf1.global_variables()
                if noise_scale.TAG in v.op.name]
    summary = scaffold.summary_op
    with tf1.Session(config=config) as sess:
      sess.run([tf1.global_variables_initializer(),
                tf1.local_variables_initializer()])
      if variable_update == cifar10_replicated.REPLICATED:
        sess.run(scaffold.local_init_op)
      for _ in range(3):
        _, text = sess.run([train_op, summary])
  values = {v.tag: v.simple_value for v in tf1.Summary.FromString(text).value
            if v.tag.startswith(noise_scale.TAG)}
  assert values[noise_scale.TAG] == pytest.approx(
      values[noise_scale.TAG + '/trace_sigma'] /
      values[noise_scale.TAG + '/gradient_squared'], rel=1e-5)
  assert values[noise_scale.TAG + '/trace_sigma'] > 0


@pytest.mark.parametrize('towers, measure', [(1, True), (2, False)])
def test_one_tower_or_the_flag_off_builds_nothing(towers, measure):
  with tf.Graph().as_default() as graph:
    build_towers(_batches(towers), ['/cpu:0'] * towers,
                 cifar10_replicated.PARAMETER_SERVER, measure_noise=measure)
    assert not _summaries(graph)
    assert not [op for op in graph.get_operations()
                if op.name.startswith(noise_scale.TAG)]
