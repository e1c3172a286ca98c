"""Adds TensorBoard summaries tagged as the tutorial's, whatever the tower.

tf.summary.scalar prefixes a tag with the name scope, so a tower's loss
would show as 'tower_0/cross_entropy'. The tutorial's TensorBoard shows
'cross_entropy', 'conv1/sparsity', 'learning_rate': these add summaries
tagged exactly so, while their ops stay in the tower's name scope, so
that a trainer can pick one tower's:

  scalar_summary('learning_rate', lr)
  histogram_summary('conv1/activations', conv1)
  summary_op = tower_summary_op('tower_1/', 'tower')
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import tensorflow as tf

tf1 = tf.compat.v1


def scalar_summary(tag, value):
  """Adds a scalar summary tagged exactly `tag`, whatever the name scope.

  Args:
    tag: the tag TensorBoard shows.
    value: a scalar tensor.
  """
  tf1.add_to_collection(tf1.GraphKeys.SUMMARIES,
                        tf.raw_ops.ScalarSummary(tags=tag, values=value))


def histogram_summary(tag, values):
  """Adds a histogram summary tagged exactly `tag` (see scalar_summary).

  Args:
    tag: the tag TensorBoard shows.
    values: a tensor.
  """
  tf1.add_to_collection(tf1.GraphKeys.SUMMARIES,
                        tf.raw_ops.HistogramSummary(tag=tag, values=values))


def tower_summary_op(scope, tower_name):
  """Merges one tower's summaries with those the towers share.

  Args:
    scope: the tower's name scope, 'tower_i/'.
    tower_name: what every tower's scope starts with, before '_i'
      (cifar10.TOWER_NAME): the other towers' copies of the same tags are
      left out.

  Returns:
    The merged summary op.
  """
  return tf1.summary.merge([
      s for s in tf1.get_collection(tf1.GraphKeys.SUMMARIES)
      if s.op.name.startswith(scope) or
      not s.op.name.startswith(tower_name + '_')])
