"""The fast LRN (machinery/lrn.py) is tf.nn.lrn: the same values and the
same gradients, in both layouts, with the tutorial's parameters and
others."""

import numpy as np
import pytest
import tensorflow as tf

from machinery import lrn

tf1 = tf.compat.v1


# The tutorial's parameters (depth_radius, bias, alpha, beta), and others:
# another window, bias and power (beta 0.5 takes tf.pow, not the rsqrt).
PARAMETERS = [(4, 1.0, 0.001 / 9.0, 0.75), (2, 2.0, 1e-3, 0.5)]


# Scale 30 makes the window sums as large as the bias: d is about 2.
@pytest.mark.parametrize('scale', [4.0, 30.0])
@pytest.mark.parametrize('fmt', ['NHWC', 'NCHW'])
@pytest.mark.parametrize('parameters', PARAMETERS)
def test_lrn_is_tf_nn_lrn(fmt, scale, parameters):
  depth_radius, bias, alpha, beta = parameters
  rng = np.random.RandomState(1)
  x = rng.normal(scale=scale, size=(4, 6, 6, 64)).astype(np.float32)
  weights = rng.normal(size=x.shape).astype(np.float32)
  with tf.Graph().as_default():
    nhwc = tf.constant(x)
    expected = tf.nn.lrn(nhwc, depth_radius, bias=bias, alpha=alpha,
                         beta=beta)
    if fmt == 'NCHW':
      normed = lrn.lrn(tf.transpose(nhwc, [0, 3, 1, 2]), depth_radius, bias,
                       alpha, beta, 'norm', fmt)
      got = tf.transpose(normed, [0, 2, 3, 1])
    else:
      got = normed = lrn.lrn(nhwc, depth_radius, bias, alpha, beta, 'norm',
                             fmt)
    assert normed.op.name == 'norm'
    grads = [tf.gradients(tf.reduce_sum(y * weights), nhwc)[0]
             for y in (expected, got)]
    with tf1.Session() as sess:
      a, b, ga, gb = sess.run([expected, got] + grads)
  np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(gb, ga, rtol=1e-4, atol=1e-5)
