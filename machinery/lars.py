"""LARS: momentum with a learning rate of its own for every layer.

You et al. (2017), "Large Batch Training of Convolutional Networks": with
one rate for all layers, a rate large enough for a large batch is too
large for some layer, whose update then outgrows its weights (a layer
pushed below zero in one step: docs/scaling.md). LARS scales each layer's
gradient by its trust ratio

  ratio = trust_coefficient * |w| / |g|

(the norms over the layer's whole weight tensor, g its gradient, which
here already holds the weight decay that cifar10.loss adds), so that a
step moves every layer by about the same fraction of its weights,
learning_rate x trust_coefficient; then momentum as usual. Biases are left
unscaled, as in the paper. TensorFlow 2.21 has no LARS in tf.compat.v1;
this is MomentumOptimizer with the scaling in front:

  opt = LARSOptimizer(learning_rate, momentum=0.9, trust_coefficient=0.001)

Each scaled layer's last ratio is summarized as 'trust_ratio/<layer>/weights'.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

from machinery import summaries
import tensorflow as tf

tf1 = tf.compat.v1


def is_bias(var):
  """Tells whether var is a layer's biases, which LARS leaves unscaled."""
  return var.op.name.split('/')[-1] == 'biases'


class LARSOptimizer(tf1.train.MomentumOptimizer):
  """MomentumOptimizer on gradients scaled by each layer's trust ratio."""

  def __init__(self, learning_rate, momentum, trust_coefficient,
               use_nesterov=False, name='LARS'):
    """Makes the optimizer.

    Args:
      learning_rate: the global rate, a float or a scalar tensor.
      momentum: the momentum, a float.
      trust_coefficient: eta, the fraction of its norm a layer moves per
        unit of learning rate.
      use_nesterov: Nesterov's momentum.
      name: the name of its ops and slots.
    """
    super(LARSOptimizer, self).__init__(learning_rate, momentum, name=name,
                                        use_nesterov=use_nesterov)
    self._trust_coefficient = trust_coefficient

  def trust_ratio(self, grad, var):
    """Returns var's trust ratio, trust_coefficient * |var| / |grad|, or 1
    where either norm is 0 (a layer at zero, or with no gradient)."""
    w_norm, g_norm = tf.norm(var), tf.norm(grad)
    return tf.where(tf.logical_and(w_norm > 0, g_norm > 0),
                    self._trust_coefficient * w_norm / g_norm,
                    tf.ones_like(w_norm))

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    """Scales every gradient but the biases' by its trust ratio, then
    applies them with momentum (MomentumOptimizer.apply_gradients)."""
    scaled = []
    with tf1.name_scope('lars'):
      for grad, var in grads_and_vars:
        if grad is None or is_bias(var):
          scaled.append((grad, var))
          continue
        ratio = self.trust_ratio(grad, var)
        if var.trainable:  # The model's variable; not a tower's copy of it.
          ratio = _keep_for_summary(ratio, var)
        scaled.append((grad * ratio, var))
    return super(LARSOptimizer, self).apply_gradients(
        scaled, global_step=global_step, name=name)


def _keep_for_summary(ratio, var):
  """Stores ratio in a local variable beside var, summarized as
  'trust_ratio/<var's name>', and returns ratio once stored.

  The summary reads the variable, not the ratio itself, which may be
  computed where a summary cannot fetch it (inside the loss scale's
  conditional update, or a SyncReplicasOptimizer's queue runner).
  """
  with tf.device(var.device):
    kept = tf1.Variable(1.0, trainable=False,
                        collections=[tf1.GraphKeys.LOCAL_VARIABLES],
                        name=var.op.name.replace('/', '_') + '_trust_ratio')
  summaries.scalar_summary('trust_ratio/' + var.op.name, kept.read_value())
  with tf.control_dependencies([kept.assign(tf.cast(ratio, tf.float32))]):
    return tf.identity(ratio)
