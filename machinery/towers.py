"""Holds what every way of building towers shares: the loop over them, the
examples of a step, and what a trainer takes from the towers.

cifar10_multi_gpu_train.py (the variables shared on /cpu:0),
cifar10_replicated.py (a copy on every tower) and the distributed trainer
build one tower per device the same way:

  for i, scope, images, labels in towers.each(batches, devices):
    loss = tower_loss(scope, images, labels)   # In tower i's device and scope.
  ...
  return towers.built(train_op, tower_losses)

so that the step line and TensorBoard report the last tower, as the
tutorial's did.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

from machinery import summaries
import tensorflow as tf

tf1 = tf.compat.v1

# Tower i is built in the name scope 'tower_i', so that each tower's ops
# have names of their own; summary tags leave it out.
TOWER_NAME = 'tower'


def each(batches, devices):
  """Yields, inside tower i's device and name scope, (i, the scope,
  images, labels) for each tower: batches and devices hold one each."""
  for i, (device, (images, labels)) in enumerate(zip(devices, batches)):
    with tf.device(device), tf1.name_scope('%s_%d' % (TOWER_NAME, i)) as scope:
      yield i, scope, images, labels


def examples(batches):
  """Returns the examples of one step: the sum of the towers' batches."""
  return sum(int(images.shape[0]) for images, _ in batches)


def built(train_op, tower_losses, **scaffold_args):
  """Returns what a trainer takes from its towers: (train_op, the last
  tower's loss for the step line, a tf.compat.v1.train.Scaffold whose
  summaries are the last tower's and those the towers share, with
  scaffold_args)."""
  last = len(tower_losses) - 1
  return train_op, tower_losses[last], tf1.train.Scaffold(
      summary_op=summaries.tower_summary_op(TOWER_NAME, last),
      **scaffold_args)
