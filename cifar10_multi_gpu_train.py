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
accordingly.

Without a GPU the towers run on the CPU (a notice says so); with
--virtual_cpus each tower gets its own virtual CPU device /cpu:i, which
shows the placement on machines without GPUs.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import collections
import contextlib
import re

import cifar10  # First: it quiets TensorFlow's start-up logging.
import cifar10_session
import tensorflow as tf

tf1 = tf.compat.v1
flags = tf1.flags
FLAGS = flags.FLAGS

cifar10_session.define_trainer_flags(max_steps=1000000)
flags.DEFINE_integer('num_gpus', 1, 'How many GPUs to use.', lower_bound=1)
flags.DEFINE_boolean('virtual_cpus', False,
                     'Without GPUs, run tower i on its own virtual CPU '
                     'device /cpu:i instead of all towers on /cpu:0.')
flags.DEFINE_enum('variable_update', 'parameter_server',
                  ['parameter_server', 'replicated'],
                  'parameter_server: the variables live on /cpu:0 and the '
                  'towers\' gradients are averaged there. replicated: each '
                  'tower keeps its own copy of the variables on its device '
                  'and the gradients are averaged by an all-reduce.')
flags.adopt_module_key_flags(cifar10)
flags.adopt_module_key_flags(cifar10_session)


def tower_loss(scope, images, labels):
  """Calculate the total loss on a single tower running the CIFAR model.

  Args:
    scope: unique prefix string identifying the CIFAR tower, e.g. 'tower_0'
    images: Images. 4D tensor of shape [batch_size, height, width, 3].
    labels: Labels. 1D tensor of shape [batch_size].

  Returns:
     Tensor of shape [] containing the total loss for a batch of data
  """
  # Build inference Graph.
  logits = cifar10.inference(images)

  # Build the portion of the Graph calculating the losses. Note that we will
  # assemble the total_loss using a custom function below.
  _ = cifar10.loss(logits, labels)

  # Assemble all of the losses for the current tower only.
  losses = tf1.get_collection('losses', scope)

  # Calculate the total loss for the current tower.
  total_loss = tf.add_n(losses, name='total_loss')

  # Attach a scalar summary to all individual losses and the total loss.
  for l in losses:
    # Remove 'tower_[0-9]/' from the name in case this is a multi-GPU training
    # session. This helps the clarity of presentation on tensorboard.
    loss_name = re.sub('%s_[0-9]*/' % cifar10.TOWER_NAME, '', l.op.name)
    cifar10.scalar_summary(loss_name, l)
  cifar10.scalar_summary('total_loss', total_loss)

  return total_loss


def average_gradients(tower_grads):
  """Calculate the average gradient for each shared variable across all towers.

  Note that this function provides a synchronization point across all towers.

  Args:
    tower_grads: List of lists of (gradient, variable) tuples. The outer list
      is over towers. The inner list is over individual gradients of each
      tower.
  Returns:
     List of pairs of (gradient, variable) where the gradient has been averaged
     across all towers.
  """
  average_grads = []
  for grad_and_vars in zip(*tower_grads):
    # Note that each grad_and_vars looks like the following:
    #   ((grad0_gpu0, var0_gpu0), ... , (grad0_gpuN, var0_gpuN))
    # Stack the towers' gradients on a new leading axis and average over it.
    grad = tf.reduce_mean(tf.stack([g for g, _ in grad_and_vars], axis=0),
                          axis=0)

    # Keep in mind that the Variables are redundant because they are shared
    # across towers. So .. we will just return the first tower's pointer to
    # the Variable.
    v = grad_and_vars[0][1]
    average_grads.append((grad, v))
  return average_grads


def tower_devices(num_towers, virtual_cpus=False):
  """Chooses a device for each tower.

  Args:
    num_towers: number of towers (--num_gpus).
    virtual_cpus: without GPUs, put tower i on virtual CPU device /cpu:i.

  Returns:
    devices: list of num_towers device names.
    config: the tf.compat.v1.ConfigProto for the session.

  Raises:
    cifar10_session.UsageError: more towers than visible GPUs.
  """
  config = cifar10_session.session_config()
  num_visible = len(tf.config.list_physical_devices('GPU'))
  if num_visible:
    if num_towers > num_visible:
      raise cifar10_session.UsageError(
          '--num_gpus=%d, but only %d GPU(s) are visible. Use --num_gpus=%d '
          'or less.' % (num_towers, num_visible, num_visible))
    return ['/gpu:%d' % i for i in range(num_towers)], config
  if virtual_cpus:
    config.device_count['CPU'] = num_towers
    return ['/cpu:%d' % i for i in range(num_towers)], config
  print('No GPU found: running the %d tower(s) on the CPU.' % num_towers)
  return ['/cpu:0'] * num_towers, config


def _replica_getter(device, tower):
  """Returns a custom getter that keeps tower's variables on its device.

  Tower 0's variables are the model's (trained, averaged, saved). The other
  towers' are local copies under 'tower_i/', kept equal to tower 0's by the
  all-reduce, neither trained by name nor saved.

  Args:
    device: the tower's device.
    tower: the tower's index.

  Returns:
    A custom getter for tf.compat.v1.variable_scope.
  """
  def custom_getter(getter, *args, **kwargs):
    if tower:
      kwargs['trainable'] = False
      kwargs['collections'] = [tf1.GraphKeys.LOCAL_VARIABLES]
    with tf.device(device):
      return getter(*args, **kwargs)
  return custom_getter


def all_reduce_mean(tower_grads, devices):
  """Averages each gradient across towers, the mean landing on every tower.

  Uses TensorFlow's collective all-reduce (a ring across the devices).

  Args:
    tower_grads: list over towers of lists of (gradient, variable) pairs.
    devices: the towers' devices, all distinct.

  Returns:
    The same structure, each gradient replaced by the mean over towers.
  """
  reduced = [[] for _ in devices]
  for key, grad_and_vars in enumerate(zip(*tower_grads)):
    for tower, (grad, var) in enumerate(grad_and_vars):
      with tf.device(devices[tower]):
        mean = tf.raw_ops.CollectiveReduceV2(
            input=grad, group_size=len(devices), group_key=1,
            instance_key=key + 1, ordering_token=[], merge_op='Add',
            final_op='Div')
      reduced[tower].append((mean, var))
  return reduced


TrainGraph = collections.namedtuple(
    'TrainGraph',
    ['train_op', 'loss', 'summary_op', 'local_init_op', 'optimizer'])


def build_train_op(batches, devices, variable_update='parameter_server',
                   num_workers=1, sync_optimizer=None):
  """Builds one tower per device and the synchronous update of them all.

  Must be called under tf.device('/cpu:0') (or a device function putting
  variables on parameter servers), so that the global step, the averaging
  and the update stay with the variables.

  Args:
    batches: list of (images, labels) pairs, one per tower.
    devices: list of device names, one per tower.
    variable_update: 'parameter_server' or 'replicated' (distinct devices).
    num_workers: machines running these towers each step, for the
      learning-rate schedule (the distributed trainer).
    sync_optimizer: None, or a function (optimizer, moving_averages),
      called once the variables exist, that wraps the optimizer to
      aggregate the workers' updates and applies the moving averages
      itself (the distributed trainer).

  Returns:
    A TrainGraph: train_op, the op for one synchronous step of all towers;
    loss, the total loss of the last tower; summary_op, the last tower's
    summaries plus the shared ones; local_init_op, the op that initializes
    the local variables after the model's are initialized or restored
    (it copies tower 0's variables to the replicas); optimizer, the
    optimizer that applies the update.
  """
  global_step = tf1.train.get_or_create_global_step()
  replicated = variable_update == 'replicated'

  # The decay schedule counts the examples of all towers in a step.
  examples_per_step = num_workers * sum(
      int(images.shape[0]) for images, _ in batches)
  lr = cifar10.learning_rate(global_step, examples_per_step)

  # Create an optimizer that performs gradient descent.
  opt = cifar10.optimizer(lr)

  # Calculate the gradients for each model tower.
  tower_grads = []
  with tf1.variable_scope(tf1.get_variable_scope()) as root:
    for i, (device, (images, labels)) in enumerate(zip(devices, batches)):
      with tf.device(device):
        with tf1.name_scope('%s_%d' % (cifar10.TOWER_NAME, i)) as scope:
          if replicated:
            var_scope = tf1.variable_scope(
                scope[:-1] if i else root, auxiliary_name_scope=False,
                custom_getter=_replica_getter(device, i))
          else:
            var_scope = contextlib.nullcontext()
          with var_scope:
            # Calculate the loss for one tower of the CIFAR model. This
            # function constructs the entire CIFAR model but shares the
            # variables across all towers.
            loss = tower_loss(scope, images, labels)

          # Reuse variables for the next tower.
          if not replicated:
            tf1.get_variable_scope().reuse_variables()

          # Calculate the gradients for the batch of data on this CIFAR
          # tower, with respect to its own variables.
          var_list = (tf1.get_collection(tf1.GraphKeys.LOCAL_VARIABLES, scope)
                      if replicated and i else tf1.trainable_variables())
          grads = opt.compute_gradients(loss, var_list=var_list)

          # Keep track of the gradients across all towers.
          tower_grads.append(grads)

  if replicated:
    # Each tower gets the mean gradient and applies it to its own copy, all
    # in one update (one loss-scale check, one global step).
    grads = sum(all_reduce_mean(tower_grads, devices), [])
  else:
    # We must calculate the mean of each gradient. Note that this is the
    # synchronization point across all towers.
    grads = average_gradients(tower_grads)

  if sync_optimizer:
    # Wrapped now that the variables to average exist.
    opt = sync_optimizer(opt, cifar10.variable_averages(global_step))

  # Apply the gradients to adjust the shared variables, then track their
  # moving averages.
  train_op = cifar10.apply_gradients(opt, grads, global_step,
                                     average=sync_optimizer is None)

  # Initializes the local variables, all of them created by now; the
  # replicas start from tower 0's values, initialized or restored.
  local_init_op = tf1.train.Scaffold.default_local_init_op()
  with tf.control_dependencies([local_init_op]):
    local_init_op = tf.group(*[
        replica.assign(var)
        for replica_grads in (tower_grads[1:] if replicated else [])
        for (_, var), (_, replica) in zip(tower_grads[0], replica_grads)])

  # Summaries of the last tower (scope) and of the shared parts, leaving out
  # the other towers' copies of the same tags.
  summaries = [s for s in tf1.get_collection(tf1.GraphKeys.SUMMARIES)
               if s.op.name.startswith(scope) or
               not s.op.name.startswith(cifar10.TOWER_NAME + '_')]
  return TrainGraph(train_op, loss, tf1.summary.merge(summaries),
                    local_init_op, opt)


def build_graph(num_towers):
  """Builds the trainer's graph, input pipeline included, per the flags.

  Args:
    num_towers: number of towers.

  Returns:
    graph: the TrainGraph.
    config: the tf.compat.v1.ConfigProto for the session.
  """
  replicated = FLAGS.variable_update == 'replicated'
  # Replicas need a device each: without GPUs, one virtual CPU per tower.
  devices, config = tower_devices(num_towers,
                                  FLAGS.virtual_cpus or replicated)
  with tf.device('/cpu:0'):
    # One input pipeline for all towers; each tower takes its own batch.
    batches = cifar10.distorted_batches(num_towers)
    graph = build_train_op(batches, devices, FLAGS.variable_update)
  return graph, config


def train():
  """Train CIFAR-10 for a number of steps."""
  with tf.Graph().as_default():
    graph, config = build_graph(FLAGS.num_gpus)
    cifar10_session.run_training(
        graph.train_op, graph.loss,
        examples_per_step=FLAGS.batch_size * FLAGS.num_gpus,
        num_towers=FLAGS.num_gpus,
        config=config,
        scaffold=tf1.train.Scaffold(summary_op=graph.summary_op,
                                    local_init_op=graph.local_init_op))


def main(argv=None):  # pylint: disable=unused-argument
  if cifar10_session.reached_max_steps(None):
    return
  cifar10.maybe_download_and_extract()
  train()


if __name__ == '__main__':
  cifar10_session.run_main(main)
