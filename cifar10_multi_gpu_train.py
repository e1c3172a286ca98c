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

With fewer GPUs than towers, --virtual_gpus splits GPU 0 into one virtual
GPU per tower (a real /gpu:i each, with its share of the memory and its
own streams), so the towers, copies and averaging run for real on one
card. Without a GPU the towers run on the CPU (a notice says so); with
--virtual_gpus each tower then gets its own virtual CPU device /cpu:i.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import collections
import contextlib
import re

import cifar10  # First: it quiets TensorFlow's start-up logging.
import cifar10_session
import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
flags = tf1.flags
FLAGS = flags.FLAGS

cifar10_session.define_trainer_flags(max_steps=1000000)
flags.DEFINE_integer('num_gpus', 1, 'How many GPUs to use.', lower_bound=1)
flags.DEFINE_boolean('virtual_gpus', False,
                     'With fewer GPUs than --num_gpus, split GPU 0 into '
                     '--num_gpus virtual GPUs, each with an equal share of '
                     'its memory; without a GPU, run tower i on its own '
                     'virtual CPU device /cpu:i instead of all on /cpu:0.')
flags.DEFINE_alias('virtual_cpus', 'virtual_gpus')
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


def tower_devices(num_towers, virtual=False):
  """Chooses a device for each tower.

  One GPU per tower where there are enough GPUs. With fewer GPUs and
  virtual, GPU 0 is split into num_towers virtual GPUs, each with an equal
  share of its memory; without a GPU, virtual gives tower i its own
  virtual CPU device /cpu:i, and otherwise all towers share /cpu:0.

  Args:
    num_towers: number of towers (--num_gpus).
    virtual: --virtual_gpus: split a device when there are too few.

  Returns:
    devices: list of num_towers device names.
    config: the tf.compat.v1.ConfigProto for the session, which makes them.

  Raises:
    cifar10_session.UsageError: more towers than GPUs, and not virtual.
  """
  config = cifar10_session.session_config()
  num_visible = len(tf.config.list_physical_devices('GPU'))
  devices = ['/gpu:%d' % i for i in range(num_towers)]
  if num_visible >= num_towers:
    return devices, config
  if num_visible and virtual:
    config.gpu_options.visible_device_list = '0'
    config.gpu_options.experimental.num_virtual_devices_per_gpu = num_towers
    print('--virtual_gpus: %d GPU(s) visible, so GPU 0 is split into %d '
          'virtual GPUs, /gpu:0 to /gpu:%d, each with 1/%d of its memory.'
          % (num_visible, num_towers, num_towers - 1, num_towers))
    return devices, config
  if num_visible:
    raise cifar10_session.UsageError(
        '--num_gpus=%d, but only %d GPU(s) are visible. Use --num_gpus=%d '
        'or less, or add --virtual_gpus to split GPU 0 into %d virtual '
        'GPUs.' % (num_towers, num_visible, num_visible, num_towers))
  config.device_count['GPU'] = 0
  if virtual:
    config.device_count['CPU'] = num_towers
    print('No GPU found: running the %d tower(s) on the CPU, tower i on '
          'virtual CPU device /cpu:i (they share its cores).' % num_towers)
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


def all_reduce_mean(tower_grads, devices, group_size=None, timeout_secs=0):
  """Averages the gradients across towers, the mean landing on every tower.

  Each tower packs its gradients into one vector, and one collective
  all-reduce averages the vectors of all towers (of every worker taking
  part, in distributed training): NCCL's where the towers are on GPUs,
  else TensorFlow's ring across the devices. The means are then unpacked.

  Args:
    tower_grads: list over towers of lists of (gradient, variable) pairs.
    devices: the towers' devices, all distinct.
    group_size: towers taking part in all, this process's and other
      workers'; None: this process's.
    timeout_secs: how long the all-reduce waits for a tower that does not
      come before it fails with DeadlineExceededError; 0: for ever.

  Returns:
    The same structure, each gradient replaced by the mean over towers.
  """
  on_gpus = all(tf.DeviceSpec.from_string(d).device_type == 'GPU'
                for d in devices)
  reduced = []
  for device, grads_and_vars in zip(devices, tower_grads):
    with tf.device(device), tf1.name_scope('all_reduce'):
      grads = [g for g, _ in grads_and_vars]
      packed = tf.concat([tf.reshape(g, [-1]) for g in grads], axis=0)
      mean = tf.raw_ops.CollectiveReduceV2(
          input=packed, group_size=group_size or len(devices), group_key=1,
          instance_key=1, ordering_token=[], merge_op='Add', final_op='Div',
          communication_hint='nccl' if on_gpus else 'auto',
          timeout_seconds=float(timeout_secs))
      means = tf.split(mean, [int(np.prod(g.shape)) for g in grads])
      reduced.append([(tf.reshape(m, g.shape), v) for m, g, (_, v) in zip(
          means, grads, grads_and_vars)])
  return reduced


TrainGraph = collections.namedtuple(
    'TrainGraph',
    ['train_op', 'loss', 'summary_op', 'local_init_op', 'optimizer'])


def build_train_op(batches, devices, variable_update='parameter_server',
                   num_workers=1, sync_optimizer=None, broadcast=None,
                   timeout_secs=0):
  """Builds one tower per device and the synchronous update of them all.

  Must be called under tf.device('/cpu:0') (or a device function putting
  variables on parameter servers), so that the global step, the averaging
  and the update stay with the variables.

  Args:
    batches: list of (images, labels) pairs, one per tower.
    devices: list of device names, one per tower.
    variable_update: 'parameter_server' or 'replicated' (distinct devices).
    num_workers: machines running these towers each step, for the
      learning-rate schedule (the distributed trainer); replicated, the
      all-reduce averages the towers of all of them.
    sync_optimizer: None, or a function (optimizer, moving_averages),
      called once the variables exist, that wraps the optimizer to
      aggregate the workers' updates and applies the moving averages
      itself (the distributed trainer's parameter-server mode).
    broadcast: None, or a function of the list of global variables that
      returns the op setting them to the chief's values once they are
      initialized or restored (the distributed trainer's all-reduce mode).
    timeout_secs: replicated: how long the all-reduce waits for a tower
      that does not come; 0: for ever.

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
    grads = sum(all_reduce_mean(tower_grads, devices,
                                num_workers * len(devices), timeout_secs), [])
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
  # replicas start from tower 0's values, initialized or restored (and
  # across workers, from the chief's).
  local_init_op = tf1.train.Scaffold.default_local_init_op()
  if broadcast:
    with tf.control_dependencies([local_init_op]):
      local_init_op = broadcast(tf1.global_variables())
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


def build_graph(num_towers, virtual=None):
  """Builds the trainer's graph, input pipeline included, per the flags.

  Args:
    num_towers: number of towers.
    virtual: whether to split a device where there are too few (see
      tower_devices); None: --virtual_gpus.

  Returns:
    graph: the TrainGraph.
    config: the tf.compat.v1.ConfigProto for the session.
  """
  replicated = FLAGS.variable_update == 'replicated'
  if virtual is None:
    virtual = FLAGS.virtual_gpus
  # Replicas need a device each: virtual ones where there are too few.
  devices, config = tower_devices(num_towers, virtual or replicated)
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
