"""A binary to train CIFAR-10 with one model split over two devices.

Model parallelism, to set beside the multi-GPU trainer's data
parallelism: there each device runs the whole model on a batch of its
own; here each device runs a part of the one model on the one batch.

Usage:
  python cifar10_model_parallel_train.py --train_dir=/tmp/cifar10_mp
  python cifar10_model_parallel_train.py --virtual_gpus   # one GPU, or none

System concept:

           /cpu:0: global step, input pipeline, learning rate
                 | batch
                 v
   +------------------------+   pool2's    +--------------------------+
   | device 0               | activations  | device 1                 |
   | conv1 pool1 norm1      | -----------> | local3 local4            |
   | conv2 norm2 pool2      | <----------- | softmax_linear, the loss |
   | their variables,       |  their grad  | their variables,         |
   | gradients and update   |              | gradients and update     |
   +------------------------+              +--------------------------+

Device 1 waits while device 0 runs the convolutions forward, and device
0 waits while device 1 runs the dense layers and the loss, forward and
backward: one batch flows through the two parts in turn. So this does
not make the step faster; what it buys is memory: a model too big for
one device fits on two. The checkpoints are the single-tower trainer's,
variable for variable, and cifar10_eval.py evaluates them unchanged.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import re

import cifar10
import cifar10_train
from machinery import cli
from machinery import hardware
from machinery import options
from machinery import recipe as recipes
from machinery import session
import tensorflow as tf

tf1 = tf.compat.v1
flags = tf1.flags
FLAGS = flags.FLAGS

session.define_trainer_flags()
flags.adopt_module_key_flags(hardware)  # --virtual_gpus
flags.adopt_module_key_flags(cifar10)
flags.adopt_module_key_flags(session)

# The model's layers (its name scopes) that each device runs, with their
# gradients; the loss goes with the last layers.
PARTS = (('conv1', 'pool1', 'norm1', 'conv2', 'norm2', 'pool2'),
         ('local3', 'local4', 'softmax_linear', 'cross_entropy_per_example',
          'cross_entropy', 'total_loss'))


def layer_placer(devices):
  """Returns a device function that puts each layer on its part's device.

  A layer's ops, its variables (the device function overrides the
  /cpu:0 that cifar10.py asks for them) and its gradient's ops (named
  'gradients/<layer>/...' or 'gradients/<layer>_grad/...') go where PARTS
  puts the layer; the other ops of the backward pass, where it starts from
  the loss, go with the loss. The updates of the variables follow them
  (TensorFlow colocates them); anything else is left to the device scopes
  around it.

  Args:
    devices: the two devices, one per part.
  """
  def device_of(op):
    backward = op.name.startswith('gradients/')
    name = op.name[len('gradients/'):] if backward else op.name
    layer = re.sub(r'_grad$', '', name.split('/')[0])
    for part, device in zip(PARTS, devices):
      if layer in part:
        return device
    return devices[-1] if backward else op.device
  return device_of


def build_train_op(batches, devices, recipe=recipes.TUTORIAL,
                   opts=options.DEFAULT):
  """Builds the split model and its training step in the default graph.

  Args:
    batches: [(images, labels)], the one batch the two parts share.
    devices: the two devices, one per part.
    recipe: the learning rate and optimizer, a machinery.recipe.Recipe.
    opts: the options for speed, a machinery.options.Options.

  Returns:
    (train_op, the total loss the step line reports, a
    tf.compat.v1.train.Scaffold), as every trainer's build_train_op.
  """
  # The single-tower trainer's step, each layer with its variables on the
  # device of its part. The activations between the parts, and their
  # gradient, are copied from one device to the other.
  with tf1.device(layer_placer(devices)):
    return cifar10_train.build_train_op(batches, [''], recipe, opts)


def run_training(recipe, opts):
  """Builds the graph and trains it until --max_steps (or --train_epochs)."""
  with tf.Graph().as_default():
    session.seed_graph(FLAGS.seed)  # With --seed, the same run every time.
    devices, config = hardware.tower_devices(
        len(PARTS), FLAGS.virtual_gpus, what='part')
    # The input pipeline on the CPU, as in cifar10_train.py.
    with tf.device('/cpu:0'):
      batch = cifar10.distorted_inputs(FLAGS.data_dir, FLAGS.batch_size, opts,
                                       FLAGS.hold_out, recipe.cutout,
                                       mixup=recipe.mixup)
    train_op, loss, scaffold = build_train_op([batch], devices, recipe, opts)
    session.train_until_done(train_op, loss, FLAGS.batch_size, recipe,
                             config=config, scaffold=scaffold)


def main(argv=None):  # pylint: disable=unused-argument
  recipe, opts = recipes.from_flags(), options.from_flags()
  # Nothing to do at --max_steps; one line if a step would not fit.
  if session.ready_to_train(cifar10, recipe, FLAGS.batch_size, towers=1):
    run_training(recipe, opts)


if __name__ == '__main__':
  cli.run_main(main)
