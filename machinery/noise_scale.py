"""Measures the gradient noise scale from the towers' own gradients.

McCandlish et al. (2018), "An Empirical Model of Large-Batch Training":
the gradient of a batch of B examples is the true gradient G plus noise
whose size shrinks as 1/B,

  E |G_B|^2 = |G|^2 + tr(Sigma) / B,

where tr(Sigma) is the total variance of one example's gradient. Their
ratio, the noise scale B_simple = tr(Sigma) / |G|^2 (in examples), is
about the batch beyond which a larger batch buys few steps: the critical
batch.

The towers compute the gradient at two batch sizes every step anyway:
each tower's own, of B_small examples, and their average, of B_big = N x
B_small. Two equations, two unknowns (their appendix A.1):

  |G|^2     ~ (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
  tr(Sigma) ~ (|G_small|^2 - |G_big|^2) / (1 / B_small - 1 / B_big)

|G_small|^2 is the mean of the towers' squared norms. Each estimate is
noisy from step to step: each is smoothed by a moving average, and the
ratio taken of the averages (not averaged itself). Summarized as
'gradient_noise_scale' with its two parts, 'gradient_noise_scale/
trace_sigma' and 'gradient_noise_scale/gradient_squared'. The averages
are local variables: not in checkpoints, they start again on a resume.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import collections

from machinery import summaries
import tensorflow as tf

tf1 = tf.compat.v1
flags = tf1.flags

# Decay of the estimates' moving averages: about the last 100 steps.
DECAY = 0.99
TAG = 'gradient_noise_scale'

flags.DEFINE_boolean('gradient_noise_scale', True,
                     'With two towers or more, measure the gradient noise '
                     'scale (the critical batch, McCandlish et al. 2018) '
                     'from the towers\' gradients, for TensorBoard.')

Estimates = collections.namedtuple('Estimates', [
    'small_squared', 'big_squared', 'gradient_squared', 'trace_sigma'])
Estimates.__doc__ = """One step's estimates, scalar float32 tensors.

Attributes:
  small_squared: |G_small|^2, the mean of the towers' squared norms.
  big_squared: |G_big|^2, the averaged gradient's squared norm.
  gradient_squared: the estimate of |G|^2.
  trace_sigma: the estimate of tr(Sigma).
"""


def squared_norm(grads_and_vars):
  """Returns the squared norm, float32, of all the gradients of a list of
  (gradient, variable) pairs, as one vector; each part computed where its
  gradient is (a tower's device), so that no gradient is copied for it."""
  parts = []
  for grad, _ in grads_and_vars:
    if grad is not None:
      with tf.device(grad.device):
        # Half the sum of squares, in one op.
        parts.append(tf.nn.l2_loss(tf.cast(grad, tf.float32)))
  return 2 * tf.add_n(parts)


def estimate(tower_grads, mean_grads, tower_batch, towers_in_mean=None):
  """Estimates |G|^2 and tr(Sigma) from one step's gradients.

  Args:
    tower_grads: one list of (gradient, variable) pairs per tower, each
      over tower_batch examples.
    mean_grads: the (gradient, variable) pairs of their mean.
    tower_batch: B_small, the examples of one tower.
    towers_in_mean: the towers mean_grads averages, these and other
      workers'; None: these.

  Returns:
    The step's Estimates.
  """
  b_small = float(tower_batch)
  b_big = float(tower_batch * (towers_in_mean or len(tower_grads)))
  with tf1.name_scope(TAG):
    small = tf.add_n([squared_norm(grads) for grads in tower_grads]) / len(
        tower_grads)
    big = squared_norm(mean_grads)
    return Estimates(
        small_squared=small, big_squared=big,
        gradient_squared=(b_big * big - b_small * small) / (b_big - b_small),
        trace_sigma=(small - big) / (1 / b_small - 1 / b_big))


def _moving_average(value, name):
  """Updates the moving average of value with this step's value, and
  returns the average after it, bias-corrected. A step whose value is not
  finite (a float16 overflow) leaves it as it was."""
  average = tf1.Variable(0.0, trainable=False, name=name,
                         collections=[tf1.GraphKeys.LOCAL_VARIABLES])
  count = tf1.Variable(0.0, trainable=False, name=name + '_count',
                       collections=[tf1.GraphKeys.LOCAL_VARIABLES])
  finite = tf.math.is_finite(value)
  update = tf.group(
      average.assign(tf.where(finite, DECAY * average + (1 - DECAY) * value,
                              average)),
      count.assign_add(tf.where(finite, 1.0, 0.0)))
  with tf.control_dependencies([update]):
    return average.read_value() / tf.maximum(
        1 - tf.pow(DECAY, count.read_value()), 1e-12)


def track(step, tower_grads, mean_grads, tower_batch, towers_in_mean=None,
          measure=True):
  """Measures the noise scale with every step, for TensorBoard.

  With one tower in the mean, or measure False (--nogradient_noise_scale),
  it builds nothing.

  Args:
    step: the op of a training step, built from these gradients.
    tower_grads: one list of (gradient, variable) pairs per tower.
    mean_grads: the mean of the towers' gradients, the same variables.
    tower_batch: the examples of one tower.
    towers_in_mean: the towers mean_grads averages, these and other
      workers'; None: these.
    measure: False builds nothing.

  Returns:
    The op that runs step and updates the moving averages (a summary
    fetched in the same run reads them after), or step itself.
  """
  if (towers_in_mean or len(tower_grads)) < 2 or not measure:
    return step
  estimates = estimate(tower_grads, mean_grads, tower_batch, towers_in_mean)
  with tf1.name_scope(TAG + '/'):
    # Each moving average, after this step's update.
    trace = _moving_average(estimates.trace_sigma, 'trace_sigma')
    squared = _moving_average(estimates.gradient_squared, 'gradient_squared')
    summaries.scalar_summary(TAG, trace / squared)
    summaries.scalar_summary(TAG + '/trace_sigma', trace)
    summaries.scalar_summary(TAG + '/gradient_squared', squared)
    return tf.group(step, trace, squared, name='step')
