"""Adds TensorBoard summaries tagged as the tutorial's, whatever the tower.

tf.summary.scalar prefixes a tag with the name scope, so a tower's loss
would show as 'tower_0/cross_entropy'. The tutorial's TensorBoard shows
'cross_entropy', 'conv1/sparsity', 'learning_rate': these add summaries
tagged exactly so, while their ops stay in the tower's name scope, so
that a trainer can pick one tower's:

  scalar_summary('learning_rate', lr)
  histogram_summary('conv1/activations', conv1)
  summary_op = tower_summary_op('tower', 1)
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import re

import tensorflow as tf

tf1 = tf.compat.v1

# cifar10_eval.py's summary of the precision @ 1 in --eval_dir, which the
# docs' scripts read (docs/event_files.py).
PRECISION_TAG = 'Precision @ 1'


def scalar_summary(tag, value):
  """Adds a scalar summary tagged exactly `tag`, whatever the name scope.

  Its op is named after the tag, in the current name scope, so that the
  graph shows it beside what it summarizes.

  Args:
    tag: the tag TensorBoard shows.
    value: a scalar tensor.
  """
  tf1.add_to_collection(tf1.GraphKeys.SUMMARIES, tf.raw_ops.ScalarSummary(
      tags=tag, values=value, name=_op_name(tag)))


def summarized(tag):
  """Returns the tensor that the default graph's scalar summary tagged
  `tag` summarizes (e.g. 'learning_rate'), or None where there is none."""
  for summary in tf1.get_collection(tf1.GraphKeys.SUMMARIES):
    op = summary.op
    if (op.type == 'ScalarSummary' and
        tf.get_static_value(op.inputs[0]) == tag.encode()):
      return op.inputs[1]
  return None


def histogram_summary(tag, values):
  """Adds a histogram summary tagged exactly `tag` (see scalar_summary).

  Args:
    tag: the tag TensorBoard shows.
    values: a tensor.
  """
  tf1.add_to_collection(tf1.GraphKeys.SUMMARIES, tf.raw_ops.HistogramSummary(
      tag=tag, values=values, name=_op_name(tag)))


def image_summary(tag, images, max_images=3):
  """Adds a summary of the first max_images of images, tagged exactly `tag`
  (see scalar_summary).

  Args:
    tag: the tag TensorBoard shows.
    images: a [batch, height, width, channels] float tensor.
    max_images: how many of them to show.
  """
  tf1.add_to_collection(tf1.GraphKeys.SUMMARIES, tf.raw_ops.ImageSummary(
      tag=tag, tensor=images, max_images=max_images, name=_op_name(tag)))


def _op_name(tag):
  """Returns an op name for a summary tagged tag: the tag, the characters
  an op name cannot hold ('cross_entropy (raw)') turned into '_'."""
  return re.sub(r'[^A-Za-z0-9_./-]', '_', tag)


def tower_summary_op(tower_name, index):
  """Merges one tower's summaries with those the towers share.

  Args:
    tower_name: what every tower's name scope starts with, before '_i'
      (cifar10.TOWER_NAME).
    index: the tower whose summaries to keep; the other towers' copies of
      the same tags are left out.

  Returns:
    The merged summary op.
  """
  scope = '%s_%d/' % (tower_name, index)
  return tf1.summary.merge([
      s for s in tf1.get_collection(tf1.GraphKeys.SUMMARIES)
      if s.op.name.startswith(scope) or
      not s.op.name.startswith(tower_name + '_')], name='summaries')
