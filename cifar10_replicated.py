"""Replicated variables: every tower its own copy, kept equal by an all-reduce.

The other way to share the model between towers (--variable_update=
replicated of the multi-GPU trainer; the all-reduce mode of the
distributed trainer, where the towers of all workers take part). Instead
of reading the shared variables on /cpu:0 and sending their gradients
there to be averaged (the parameter-server way of
cifar10_multi_gpu_train.py), each tower keeps a copy of every variable on
its own device. Each step:

  tower i: loss and gradients with respect to its own copy
  all-reduce: the mean of every tower's gradients lands on every tower
  tower i: applies the mean to its own copy

Every copy starts equal (tower 0's values, initialized or restored) and
applies the same mean, so the copies stay equal. Tower 0's variables are
the model's: trained, averaged, saved, with the same names as in the
parameter-server way, so checkpoints are the same. The other towers'
copies are local variables under 'tower_i/', neither saved nor trained
by name.

The all-reduce packs each tower's gradients into one vector and runs one
collective on them: NCCL's where every tower has a GPU of its own, else
TensorFlow's ring across the devices (machinery/hardware.py).
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import functools

import cifar10
from machinery import hardware
from machinery import noise_scale
from machinery import options
from machinery import recipe as recipes
from machinery import summaries
import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
flags = tf1.flags
FLAGS = flags.FLAGS

# The two values of --variable_update: the variables on /cpu:0 (or on the
# ps tasks), or a copy on every tower.
PARAMETER_SERVER = 'parameter_server'
REPLICATED = 'replicated'

flags.DEFINE_enum('variable_update', PARAMETER_SERVER,
                  [PARAMETER_SERVER, REPLICATED],
                  'parameter_server: the variables live on /cpu:0 and the '
                  'towers\' gradients are averaged there. replicated: each '
                  'tower keeps its own copy of the variables on its device '
                  'and the gradients are averaged by an all-reduce.')


def _replica_getter(device, tower):
  """Returns a custom getter that keeps tower's variables on its device.

  Tower 0's variables are the model's; the other towers' are local copies.

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


def all_reduce_mean(tower_grads, devices, group_size=None, timeout_secs=0,
                    communication='ring'):
  """Averages the gradients across towers, the mean landing on every tower.

  Each tower packs its gradients into one vector, and one collective
  all-reduce averages the vectors of all towers (of every worker taking
  part, in distributed training). The means are then unpacked.

  Args:
    tower_grads: list over towers of lists of (gradient, variable) pairs.
    devices: the towers' devices, all distinct.
    group_size: towers taking part in all, this process's and other
      workers'; None: this process's.
    timeout_secs: how long the all-reduce waits for a tower that does not
      come before it fails with DeadlineExceededError; 0: for ever.
    communication: 'nccl' or 'ring' (hardware.all_reduce_between).

  Returns:
    The same structure, each gradient replaced by the mean over towers.
  """
  reduced = []
  for device, grads_and_vars in zip(devices, tower_grads):
    with tf.device(device), tf1.name_scope('all_reduce/'):
      grads = [g for g, _ in grads_and_vars]
      packed = tf.concat([tf.reshape(g, [-1]) for g in grads], axis=0)
      mean = tf.raw_ops.CollectiveReduceV2(
          input=packed, group_size=group_size or len(devices), group_key=1,
          instance_key=1, ordering_token=[], merge_op='Add', final_op='Div',
          communication_hint=communication,
          timeout_seconds=float(timeout_secs))
      means = tf.split(mean, [int(np.prod(g.shape)) for g in grads])
      reduced.append([(tf.reshape(m, g.shape), v) for m, g, (_, v) in zip(
          means, grads, grads_and_vars)])
  return reduced


def _towers(opt, batches, devices, tower_loss, recipe, opts):
  """Builds one tower per device, each on its own copy of the variables.

  Returns:
    (one list of (gradient, variable) pairs per tower, each tower's loss).
  """
  tower_grads, tower_losses = [], []
  with tf1.variable_scope(tf1.get_variable_scope()) as root:
    for i in range(len(devices)):
      # Tower i on its own device, in the name scope 'tower_i', as the
      # multi-GPU trainer builds its towers.
      with tf.device(devices[i]):
        with tf1.name_scope('%s_%d' % (cifar10.TOWER_NAME, i)) as scope:
          # Tower 0 makes the model's variables; tower i its copies under
          # 'tower_i/', on its own device.
          images, labels = batches[i]
          with tf1.variable_scope(scope[:-1] if i else root,
                                  auxiliary_name_scope=False,
                                  custom_getter=_replica_getter(devices[i],
                                                                i)):
            loss = tower_loss(scope, images, labels, recipe, opts)
          # The gradients with respect to the tower's own copy.
          var_list = (tf1.get_collection(tf1.GraphKeys.LOCAL_VARIABLES, scope)
                      if i else tf1.trainable_variables())
          tower_grads.append(opt.compute_gradients(loss, var_list=var_list))
          tower_losses.append(loss)
  return tower_grads, tower_losses


def _copy_to_replicas(tower_grads, broadcast):
  """Makes the local init op: after the model's variables are initialized or
  restored (and broadcast from the chief, across workers), every tower's
  copy takes tower 0's values."""
  with tf1.name_scope('copy_to_replicas'):
    local_init_op = tf1.train.Scaffold.default_local_init_op()
    if broadcast:
      with tf.control_dependencies([local_init_op]):
        local_init_op = broadcast(tf1.global_variables())
    with tf.control_dependencies([local_init_op]):
      return tf.group(*[
          replica.assign(var) for replica_grads in tower_grads[1:]
          for (_, var), (_, replica) in zip(tower_grads[0], replica_grads)])


def builder(devices, tower_loss, gpus_shared=False):
  """Chooses the all-reduce for towers on devices, and says which.

  Args:
    devices: the towers' devices, all distinct.
    tower_loss: function (scope, images, labels, recipe, opts) -> one
      tower's total loss (cifar10_multi_gpu_train.tower_loss).
    gpus_shared: other workers' towers run on these GPUs too.

  Returns:
    A function (batches, devices, recipe, opts, measure_noise, **kwargs) ->
    what build_train_op returns: build_train_op with that all-reduce and
    tower_loss.
  """
  communication, line = hardware.all_reduce_between(devices, gpus_shared)
  print(line)
  return functools.partial(build_train_op, tower_loss=tower_loss,
                           communication=communication)


def build_train_op(batches, devices, recipe=recipes.TUTORIAL,
                   opts=options.DEFAULT, measure_noise=True, *, tower_loss,
                   communication='ring', num_workers=1, broadcast=None,
                   timeout_secs=0):
  """Builds one tower per device, each with its own copy of the variables,
  and the synchronous update of them all.

  Must be called under tf.device('/cpu:0') (of the worker), where the
  global step goes.

  Args:
    batches: list of (images, labels) pairs, one per tower.
    devices: list of distinct device names, one per tower.
    recipe: the learning rate and optimizer, a machinery.recipe.Recipe.
    opts: the options for speed, a machinery.options.Options.
    measure_noise: measure the gradient noise scale (machinery/noise_scale).
    tower_loss: function (scope, images, labels, recipe, opts) -> the
      tower's total loss (cifar10_multi_gpu_train.tower_loss).
    communication: the all-reduce's, 'nccl' or 'ring' (builder).
    num_workers: workers running these towers each step; the all-reduce
      averages the towers of all of them.
    broadcast: None, or a function of the list of global variables that
      returns the op setting them to the chief's values once they are
      initialized or restored (the distributed trainer).
    timeout_secs: how long the all-reduce waits for a tower that does not
      come; 0: for ever.

  Returns:
    (train_op, the last tower's loss (for the step line), the
    tf.compat.v1.train.Scaffold with the last tower's summaries and the op
    that fills the copies).
  """
  global_step = tf1.train.get_or_create_global_step()
  examples = sum(int(images.shape[0]) for images, _ in batches)
  opt = cifar10.optimizer(cifar10.learning_rate(
      global_step, num_workers * examples, recipe), recipe, opts)
  tower_grads, tower_losses = _towers(opt, batches, devices, tower_loss,
                                      recipe, opts)

  # Each tower gets the mean gradient and applies it to its own copy, all
  # in one update (one loss-scale check, one global step).
  reduced = all_reduce_mean(tower_grads, devices, num_workers * len(devices),
                            timeout_secs, communication)
  # With it, the gradient noise scale, from the towers' gradients and tower
  # 0's copy of their mean (machinery/noise_scale.py).
  train_op = noise_scale.track(
      cifar10.apply_gradients(opt, sum(reduced, []), global_step,
                              recipe.moving_average_decay),
      tower_grads, reduced[0], int(batches[0][0].shape[0]),
      num_workers * len(devices), measure_noise)
  # The step line reports the last tower's loss, TensorBoard shows its
  # summaries, as with shared variables.
  last = len(devices) - 1
  return train_op, tower_losses[last], tf1.train.Scaffold(
      summary_op=summaries.tower_summary_op(cifar10.TOWER_NAME, last),
      local_init_op=_copy_to_replicas(tower_grads, broadcast))
