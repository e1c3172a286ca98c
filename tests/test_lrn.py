"""The fast LRN (cifar10_lrn.py) is tf.nn.lrn with the tutorial's
parameters: the same values and the same gradients, in both layouts."""

import numpy as np
import pytest
import tensorflow as tf

import cifar10_lrn

tf1 = tf.compat.v1


# Scale 30 makes the window sums as large as the bias: d is about 2.
@pytest.mark.parametrize('scale', [4.0, 30.0])
@pytest.mark.parametrize('fmt', ['NHWC', 'NCHW'])
def test_lrn_is_tf_nn_lrn_with_the_tutorial_parameters(fmt, scale):
  rng = np.random.RandomState(1)
  x = rng.normal(scale=scale, size=(4, 6, 6, 64)).astype(np.float32)
  weights = rng.normal(size=x.shape).astype(np.float32)
  with tf.Graph().as_default():
    nhwc = tf.constant(x)
    expected = tf.nn.lrn(nhwc, 4, bias=1.0, alpha=0.001 / 9.0, beta=0.75)
    if fmt == 'NCHW':
      normed = cifar10_lrn.lrn(tf.transpose(nhwc, [0, 3, 1, 2]), 'norm', fmt)
      got = tf.transpose(normed, [0, 2, 3, 1])
    else:
      got = normed = cifar10_lrn.lrn(nhwc, 'norm', fmt)
    assert normed.op.name == 'norm'
    grads = [tf.gradients(tf.reduce_sum(y * weights), nhwc)[0]
             for y in (expected, got)]
    with tf1.Session() as sess:
      a, b, ga, gb = sess.run([expected, got] + grads)
  np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(gb, ga, rtol=1e-4, atol=1e-5)
