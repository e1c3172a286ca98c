"""A binary to train CIFAR-10 using multiple GPUs with synchronous updates.

Accuracy:
The tutorial reported ~84% precision @ 1 after 30K steps with 2 to 4
GPUs at 128 images per GPU (cifar10_eval.py).

Usage:
  python cifar10_multi_gpu_train.py --num_gpus=2 --data_dir=/tmp/cifar10_data \\
      --train_dir=/tmp/cifar10_train

System concept:

                 /cpu:0: variables, global step, input pipeline
          +------------------------------------------------------+
          | shuffle -> distort -> batch -> prefetch(2 x towers)  |
          +------------------------------------------------------+
               | batch 0          | batch 1    ...     | batch N-1
          +---------+        +---------+          +---------+
          | /gpu:0  |        | /gpu:1  |   ...    | /gpu:N-1|   tower_i:
          | tower_0 |        | tower_1 |          | tower_N-1   model, loss,
          +---------+        +---------+          +---------+   gradients
               \\ grads          | grads            / grads
                +---> average_gradients (on /cpu:0) <---+
                              |
              apply to the shared variables, then moving averages

Each step, every tower reads the same (shared) variables, computes the
gradients of its own batch, and one update applies the mean of all
towers' gradients: synchronous data parallelism. A step consumes
batch_size x num_gpus examples; the learning-rate schedule counts epochs
accordingly. With one GPU, --virtual_gpus splits it into one virtual GPU
per tower; without a GPU the towers run on the CPU. The other way to share
the variables, --variable_update=replicated, keeps a copy on every tower,
kept equal by an all-reduce of the gradients (cifar10_replicated.py).
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import re

import cifar10
import cifar10_replicated
from machinery import cli
from machinery import hardware
from machinery import noise_scale
from machinery import options
from machinery import recipe as recipes
from machinery import session
from machinery import summaries
import tensorflow as tf

tf1 = tf.compat.v1
flags = tf1.flags
FLAGS = flags.FLAGS

session.define_trainer_flags()
flags.DEFINE_integer('num_gpus', 1, 'How many GPUs to use.', lower_bound=1)
flags.adopt_module_key_flags(hardware)  # --virtual_gpus
flags.adopt_module_key_flags(noise_scale)  # --gradient_noise_scale
flags.adopt_module_key_flags(cifar10_replicated)  # --variable_update
flags.adopt_module_key_flags(cifar10)
flags.adopt_module_key_flags(session)

# The multi-GPU trainer's default: a million steps, as the tutorial's.
MAX_STEPS = 1000000

# Read on top to bottom: tower_loss (one tower), tower_gradients (a tower on
# every device, all sharing the variables), average_gradients (where the
# towers synchronize), build_train_op (one step), build_graph (the input and
# the towers on their devices) and run_training (the loop).


def tower_loss(scope, images, labels, recipe=recipes.TUTORIAL,
               opts=options.DEFAULT):
  """Builds the model on one tower's batch and returns that tower's loss.

  Args:
    scope: the tower's name scope, e.g. 'tower_0/'.
    images: the tower's images, [batch_size, height, width, 3].
    labels: the tower's labels, [batch_size].
    recipe: how the model trains (its weight decay and labels), a
      machinery.recipe.Recipe.
    opts: the options for speed, a machinery.options.Options.

  Returns:
     The tower's total loss: its cross entropy plus the weight decay terms.
  """
  # The whole model, on this tower's images.
  logits = cifar10.inference(images, opts, recipe.conv_weight_decay,
                             recipe.dropout, recipe.fc_weight_decay)

  # Its loss: cross entropy plus weight decay, the terms this tower made
  # (in its name scope).
  total_loss = cifar10.loss(logits, labels, recipe.label_smoothing)
  losses = tf1.get_collection('losses', scope)

  # Summaries of each loss term and of the total, tagged without the
  # 'tower_i/' prefix: TensorBoard shows 'cross_entropy (raw)', not
  # 'tower_0/cross_entropy (raw)'.
  # Raw values, as '(raw)' says in cifar10_train.py's TensorBoard, whose
  # plain tags are moving averages.
  for l in losses:
    loss_name = re.sub('%s_[0-9]*/' % cifar10.TOWER_NAME, '', l.op.name)
    summaries.scalar_summary(loss_name + ' (raw)', l)
  summaries.scalar_summary('total_loss (raw)', total_loss)
  return total_loss


def tower_gradients(opt, batches, devices, recipe=recipes.TUTORIAL,
                    opts=options.DEFAULT):
  """Builds one tower per device, all on the same variables, and each
  tower's gradients.

  Args:
    opt: the optimizer, which computes the gradients.
    batches: list of (images, labels) pairs, one per tower.
    devices: list of device names, one per tower.
    recipe: how the model trains, a machinery.recipe.Recipe.
    opts: the options for speed, a machinery.options.Options.

  Returns:
    (one list of (gradient, variable) pairs per tower, each tower's loss).
  """
  tower_grads, tower_losses = [], []
  with tf1.variable_scope(tf1.get_variable_scope()):
    for i in range(len(devices)):
      # Tower i: on its own device, in its own name scope, 'tower_i'.
      with tf.device(devices[i]):
        with tf1.name_scope('%s_%d' % (cifar10.TOWER_NAME, i)) as scope:
          # The whole model on this tower's batch. tf.get_variable() in it
          # makes the variables in tower 0 and finds them in the others:
          # every tower shares them.
          images, labels = batches[i]
          loss = tower_loss(scope, images, labels, recipe, opts)

          # From here on, get the existing variables; make none.
          tf1.get_variable_scope().reuse_variables()

          # This tower's gradients with respect to the shared variables.
          tower_grads.append(opt.compute_gradients(loss))
          tower_losses.append(loss)
  return tower_grads, tower_losses


def average_gradients(tower_grads):
  """Averages each shared variable's gradient over the towers.

  Every tower must have computed its gradients before their mean exists:
  this is where the towers synchronize.

  Args:
    tower_grads: one list of (gradient, variable) pairs per tower, the
      variables in the same order in every list.

  Returns:
     One list of (mean gradient, variable) pairs.
  """
  average_grads = []
  with tf1.name_scope('average_gradients'):
    for grad_and_vars in zip(*tower_grads):
      # grad_and_vars holds one variable's gradient from every tower:
      #   ((grad_tower0, var), (grad_tower1, var), ..., (grad_towerN, var)).
      # Stack them on a new leading axis and average over it.
      grad = tf.reduce_mean(tf.stack([g for g, _ in grad_and_vars], axis=0),
                            axis=0)
      # The towers share the variable: any tower's pair names it.
      average_grads.append((grad, grad_and_vars[0][1]))
  return average_grads


def build_train_op(batches, devices, recipe=recipes.TUTORIAL,
                   opts=options.DEFAULT, measure_noise=True):
  """Builds one tower per device and the synchronous update of them all.

  Call it under tf.device('/cpu:0'), so that the global step, the average
  and the update stay with the shared variables.

  Args:
    batches: list of (images, labels) pairs, one per tower.
    devices: list of device names, one per tower.
    recipe: the learning rate and optimizer, a machinery.recipe.Recipe.
    opts: the options for speed, a machinery.options.Options.
    measure_noise: measure the gradient noise scale (--gradient_noise_scale).

  Returns:
    (train_op, the loss the step line reports, a tf.compat.v1.train.Scaffold
    with the summaries TensorBoard shows).
  """
  global_step = tf1.train.get_or_create_global_step()

  # The learning rate decays every 350 epochs: count all towers' examples.
  examples = sum(int(images.shape[0]) for images, _ in batches)
  lr = cifar10.learning_rate(global_step, examples, recipe)

  # One optimizer, on the shared variables: the tutorial's gradient descent,
  # or the recipe's.
  opt = cifar10.optimizer(lr, recipe, opts)

  # One tower per device, each computing the gradients of its own batch.
  tower_grads, tower_losses = tower_gradients(opt, batches, devices, recipe,
                                              opts)

  # The mean of each gradient over the towers: the synchronization point.
  grads = average_gradients(tower_grads)

  # Apply it to the shared variables, then update their moving averages
  # (the weights cifar10_eval.py evaluates). Beside it, how far each tower's
  # gradient is from the mean tells how noisy one batch's gradient is: the
  # gradient noise scale, for TensorBoard (machinery/noise_scale.py).
  train_op = noise_scale.track(
      cifar10.apply_gradients(opt, grads, global_step,
                              recipe.moving_average_decay), tower_grads, grads,
      int(batches[0][0].shape[0]), measure=measure_noise)

  # As the tutorial's, the step line reports the last tower's loss and
  # TensorBoard shows the last tower's summaries, beside the shared ones.
  last = len(devices) - 1
  return train_op, tower_losses[last], tf1.train.Scaffold(
      summary_op=summaries.tower_summary_op(cifar10.TOWER_NAME, last))


def build_graph(data_dir, batch_size, num_towers, virtual=False,
                variable_update=cifar10_replicated.PARAMETER_SERVER,
                recipe=recipes.TUTORIAL, opts=options.DEFAULT,
                measure_noise=True, hold_out=False, skip=0):
  """Builds the trainer's graph: the towers on their devices, and the input
  they share.

  Args:
    data_dir, batch_size, hold_out, skip: the input's
      (cifar10.distorted_batches).
    num_towers: number of towers.
    virtual: --virtual_gpus: split a device where there are too few.
    variable_update: how the towers share the variables, --variable_update.
    recipe: the learning rate and optimizer, a machinery.recipe.Recipe.
    opts: the options for speed, a machinery.options.Options.
    measure_noise: measure the gradient noise scale.

  Returns:
    (train_op, loss, scaffold, the tf.compat.v1.ConfigProto for the session).
  """
  # A device for each tower (machinery/hardware.py): GPU i, or with
  # --virtual_gpus a virtual GPU (a virtual CPU device without a GPU). A
  # tower with a copy of its own of the variables needs its own device.
  replicated = variable_update == cifar10_replicated.REPLICATED
  devices, config = hardware.tower_devices(num_towers, virtual or replicated)

  with tf.device('/cpu:0'):
    # One input pipeline for all towers; each tower takes its own batch.
    batches = cifar10.distorted_batches(data_dir, batch_size, num_towers, opts,
                                        hold_out, recipe.cutout, skip,
                                        recipe.mixup)
    # The towers and their update: on the variables shared here, or on a
    # copy per tower, with an all-reduce (cifar10_replicated.py).
    build = (cifar10_replicated.builder(devices, tower_loss) if replicated
             else build_train_op)
    train_op, loss, scaffold = build(batches, devices, recipe, opts,
                                     measure_noise)
  return train_op, loss, scaffold, config


def run_training(recipe, opts):
  """Builds the towers and trains them until --max_steps (or
  --train_epochs)."""
  with tf.Graph().as_default():
    session.seed_graph(FLAGS.seed)  # With --seed, the same run every time.
    # Resumed with --seed, the input passes over the examples drawn before.
    skip = session.examples_drawn(FLAGS.train_dir, FLAGS.seed,
                                  FLAGS.batch_size * FLAGS.num_gpus)
    train_op, loss, scaffold, config = build_graph(
        FLAGS.data_dir, FLAGS.batch_size, FLAGS.num_gpus, FLAGS.virtual_gpus,
        FLAGS.variable_update, recipe, opts, FLAGS.gradient_noise_scale,
        FLAGS.hold_out, skip)

    # As the single-tower trainer's session, the step line counting the
    # examples of every tower, and sec/batch a tower's share of the step.
    with session.training_session(
        loss, FLAGS.batch_size * FLAGS.num_gpus, recipe,
        num_towers=FLAGS.num_gpus, config=config,
        scaffold=scaffold) as mon_sess:
      while not mon_sess.should_stop():
        mon_sess.run(train_op)


def main(argv=None):  # pylint: disable=unused-argument
  recipe, opts = recipes.from_flags(), options.from_flags()
  # Nothing to do at --max_steps; one line if a step would not fit.
  if session.ready_to_train(cifar10, recipe, FLAGS.batch_size * FLAGS.num_gpus,
                            towers=FLAGS.num_gpus):
    run_training(recipe, opts)


if __name__ == '__main__':
  cli.run_main(main, defaults={'max_steps': MAX_STEPS})
