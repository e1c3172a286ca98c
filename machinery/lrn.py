"""Computes the tutorial's local response normalization (norm1, norm2) fast.

lrn(x, depth_radius, bias, alpha, beta, name, data_format) is the same
function as

  tf.nn.lrn(x, depth_radius, bias=bias, alpha=alpha, beta=beta)

(tests/test_lrn.py holds the two against each other, values and
gradients): each value divided by (bias + alpha * the sum of the squares
of the 2 * depth_radius + 1 nearest channels) ** beta. Here the window
sums are a matmul with a 0/1 band matrix, and the gradient is written out
in 6 ops; on CPUs this trains several times faster than tf.nn.lrn's
LRNGrad kernel, and it runs in any layout. It computes in float32
whatever the model's precision.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1


def _band(channels, depth_radius, scale):
  """Returns scale times the [channels, channels] 0/1 band of the windows."""
  distance = np.abs(np.arange(channels)[:, None] - np.arange(channels))
  return (scale * (distance <= depth_radius)).astype(np.float32)


def _power(d, beta):
  """Returns d ** -beta; for the tutorial's 0.75, as rsqrt(d) *
  sqrt(rsqrt(d)), which CPUs compute faster than a power."""
  if beta == 0.75:
    r = tf.math.rsqrt(d)
    return r * tf.sqrt(r)
  return tf.pow(d, -beta)


def _lrn_rows(depth_radius, bias, alpha, beta):
  """Makes LRN over the last axis of a [rows, channels] float32 matrix.

  Returns:
    A function of the matrix with the gradient written out.
  """
  @tf.custom_gradient
  def lrn_rows(x):
    channels = int(x.shape[-1])
    # d = bias + alpha * (sum of the squares in each window); y = x * d**-beta.
    d = bias + tf.matmul(tf.square(x), _band(channels, depth_radius, alpha))
    scale = _power(d, beta)
    y = x * scale

    def grad(dy):
      # dx_i = dy_i * d_i**-beta
      #        - 2 * alpha * beta * x_i * sum_{j in window i} dy_j * y_j / d_j.
      window = tf.matmul(dy * y / d,
                         _band(channels, depth_radius, 2 * alpha * beta))
      return dy * scale - x * window

    return y, grad
  return lrn_rows


def lrn(x, depth_radius, bias, alpha, beta, name, data_format):
  """Normalizes over the channels, as tf.nn.lrn.

  Args:
    x: activations, [batch, height, width, channels] ('NHWC') or
      [batch, channels, height, width] ('NCHW'), of any float type.
    depth_radius: channels on each side of a channel in its window.
    bias: added to the window's weighted sum of squares.
    alpha: the weight of the sum of squares.
    beta: the power the sum is raised to.
    name: the name of the result's op.
    data_format: 'NHWC' or 'NCHW'.

  Returns:
    The normalized activations, of x's layout and type, as op `name`.
  """
  with tf1.name_scope(name) as scope:
    y = tf.cast(x, tf.float32)
    if data_format == 'NCHW':
      y = tf.transpose(y, [0, 2, 3, 1])
    shape = tf.shape(y)
    rows = tf.reshape(y, [-1, int(y.shape[-1])])
    y = tf.reshape(_lrn_rows(depth_radius, bias, alpha, beta)(rows), shape)
    if data_format == 'NCHW':
      y = tf.transpose(y, [0, 3, 1, 2])
    return tf.identity(tf.cast(y, x.dtype), name=scope)
