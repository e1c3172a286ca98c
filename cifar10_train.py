"""A binary to train CIFAR-10 using a single GPU (or the CPU).

Accuracy:
The tutorial reported ~86% precision @ 1 after 100K steps (256 epochs of
data) at batch 128, as judged by cifar10_eval.py. Measured here: see the
README.

Usage:
  python cifar10_train.py --data_dir=/tmp/cifar10_data \\
      --train_dir=/tmp/cifar10_train --max_steps=100000

It logs `<datetime>: step N, loss = L (E examples/sec; S sec/batch)` every
--log_frequency steps, and writes checkpoints and TensorBoard summaries to
--train_dir. A rerun with the same --train_dir resumes from its latest
checkpoint; to start over, delete --train_dir or name another. Ctrl-C or
SIGTERM saves a checkpoint and stops.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import cifar10
from machinery import cli
from machinery import hardware
from machinery import options
from machinery import recipe as recipes
from machinery import session
import tensorflow as tf

tf1 = tf.compat.v1
FLAGS = tf1.flags.FLAGS

session.define_trainer_flags()
tf1.flags.adopt_module_key_flags(cifar10)
tf1.flags.adopt_module_key_flags(session)


def build_train_op(batches, devices, recipe=recipes.TUTORIAL,
                   opts=options.DEFAULT):
  """Builds the single-tower training step, in the default graph.

  Every trainer's build_train_op takes the same arguments and returns the
  same three things; here there is one tower.

  Args:
    batches: [(images, labels)], the one tower's batch: images
      [batch_size, 24, 24, 3], labels [batch_size].
    devices: [the device the tower runs on]; '' leaves it to TensorFlow
      (a GPU where there is one).
    recipe: the learning rate and optimizer, a machinery.recipe.Recipe.
    opts: the options for speed, a machinery.options.Options.

  Returns:
    (train_op, the total loss the step line reports, a
    tf.compat.v1.train.Scaffold with the summaries TensorBoard shows).
  """
  (images, labels), = batches
  # On the CPU, beside the variables: the hooks read it every step.
  with tf.device('/cpu:0'):
    global_step = tf1.train.get_or_create_global_step()

  with tf.device(devices[0]):
    # The model's logits for the batch.
    logits = cifar10.inference(images, opts, recipe.conv_weight_decay,
                               recipe.dropout, recipe.fc_weight_decay)

    # Its loss: cross entropy plus weight decay.
    loss = cifar10.loss(logits, labels, recipe.label_smoothing)

    # One step of gradient descent on the batch, then the moving averages.
    train_op = cifar10.train(loss, global_step, int(images.shape[0]), recipe,
                             opts)
  return train_op, loss, tf1.train.Scaffold()


def run_training(recipe, opts):
  """Builds the graph and trains it until --max_steps (or --train_epochs)."""
  with tf.Graph().as_default():
    session.seed_graph(FLAGS.seed)  # With --seed, the same run every time.

    # A batch of distorted training images and their labels. The input
    # pipeline stays on the CPU, leaving the GPU to the model: the tutorial
    # went from about 1,700 to 8,000 images/s on a GTX 1080 that way.
    # Resumed with --seed, it passes over the examples drawn before.
    skip = session.examples_drawn(FLAGS.train_dir, FLAGS.seed,
                                  FLAGS.batch_size)
    with tf.device('/cpu:0'):
      images, labels = cifar10.distorted_inputs(FLAGS.data_dir,
                                                FLAGS.batch_size, opts,
                                                FLAGS.hold_out, recipe.cutout,
                                                skip, recipe.mixup)
    train_op, loss, scaffold = build_train_op([(images, labels)], [''],
                                              recipe, opts)

    # The session restores the latest checkpoint of --train_dir (or
    # initializes the model), saves checkpoints and summaries as it goes,
    # and runs its hooks around every step: stop at --max_steps, stop on
    # a NaN loss, print the step line.
    with session.training_session(
        loss, FLAGS.batch_size, recipe, config=hardware.session_config(),
        scaffold=scaffold) as mon_sess:
      while not mon_sess.should_stop():
        mon_sess.run(train_op)


def main(argv=None):  # pylint: disable=unused-argument
  recipe, opts = recipes.from_flags(), options.from_flags()
  # Nothing to do at --max_steps; one line if a step would not fit.
  if session.ready_to_train(cifar10, recipe, FLAGS.batch_size, towers=1):
    run_training(recipe, opts)


if __name__ == '__main__':
  cli.run_main(main)
