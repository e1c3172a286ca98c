"""Trains CIFAR-10 across machines on TensorFlow's distributed runtime.

Two ways to share the variables, chosen by the cluster (or by
--variable_update):

Parameter servers (the cluster has ps tasks; parameter_server): the ps
tasks hold the variables; each worker runs --num_gpus towers (the
multi-GPU trainer's towers, averaged locally) and sends the mean gradient
to them. With --sync_replicas (the default) a SyncReplicasOptimizer
aggregates one gradient from every worker into each update; without it
every worker updates on its own (asynchronous).

All-reduce (no ps tasks; replicated): every worker keeps its own copy of
the variables on its towers. Each step one collective all-reduce averages
the gradients of all towers of all workers, and every copy applies the
same mean, so the copies stay equal. The chief broadcasts its initial or
restored values to the others. A worker that waits --peer_timeout_secs
for a peer that is gone says which and exits; restarting the cluster
resumes from the chief's checkpoint.

Either way worker 0 is the chief: it initializes or restores the model
and writes checkpoints and summaries to --train_dir. The cluster is given
by --ps_hosts, --worker_hosts, --job_name and --task_index, or by the
TF_CONFIG environment variable (machinery/cluster.py).

Usage, 1 ps + 2 workers on one machine (one command per terminal):
  H='--ps_hosts=127.0.0.1:2222 --worker_hosts=127.0.0.1:2223,127.0.0.1:2224'
  python cifar10_distributed_train.py $H --job_name=ps --task_index=0
  python cifar10_distributed_train.py $H --job_name=worker --task_index=0 \\
      --train_dir=/tmp/cifar10_dist --max_steps=300
  python cifar10_distributed_train.py $H --job_name=worker --task_index=1 \\
      --train_dir=/tmp/cifar10_dist --max_steps=300

and 2 workers all-reducing, no ps:
  H='--worker_hosts=127.0.0.1:2223,127.0.0.1:2224'
  python cifar10_distributed_train.py $H --job_name=worker --task_index=0 \\
      --train_dir=/tmp/cifar10_allreduce --max_steps=300
  python cifar10_distributed_train.py $H --job_name=worker --task_index=1 \\
      --max_steps=300

A synchronous step consumes batch_size x num_gpus x workers examples; the
learning-rate schedule counts them. Every process exits when training
ends: the ps tasks once every worker has said it is done.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import cifar10
import cifar10_multi_gpu_train as multi
import cifar10_replicated
from machinery import cli
from machinery import cluster
from machinery import errors
from machinery import hardware
from machinery import noise_scale
from machinery import options
from machinery import ps_task
from machinery import recipe as recipes
from machinery import session
from machinery import summaries
from machinery import worker_session
import tensorflow as tf

tf1 = tf.compat.v1
flags = tf1.flags
FLAGS = flags.FLAGS

flags.DEFINE_boolean('sync_replicas', True,
                     'Parameter servers: aggregate one gradient from every '
                     'worker into each update; false: every worker updates '
                     'on its own.')
flags.DEFINE_integer('stall_report_secs', 60,
                     'Parameter servers: report when a step waits longer '
                     'than this (a worker missing in synchronous mode).',
                     lower_bound=1)
flags.DEFINE_integer('peer_timeout_secs', 300,
                     'All-reduce: how long a worker waits for a peer that '
                     'does not come (stopped, or never started) before it '
                     'says which and exits.', lower_bound=1)
flags.adopt_module_key_flags(cluster)  # --job_name, --task_index, the hosts
flags.adopt_module_key_flags(multi)
flags.adopt_module_key_flags(cifar10)

# Read on top to bottom: a worker's graph with parameter servers
# (build_worker_graph) or all-reducing (build_allreduce_graph), its session
# and loop (run_training), which way the cluster shares the variables
# (mode_of), and main: the cluster, this task's server, and what a ps task
# or a worker does with it.


def build_worker_graph(task, batches, local_devices, sync_replicas,
                       recipe=recipes.TUTORIAL, opts=options.DEFAULT,
                       measure_noise=True):
  """Builds a worker's step for parameter-server mode, in the default graph.

  The multi-GPU trainer's towers and average on the worker; the variables
  on the ps tasks; with sync_replicas, one update from every worker.

  Args:
    task: the worker's cluster.Task.
    batches: the towers' (images, labels) pairs, built on the worker's CPU.
    local_devices: the towers' devices on the worker, e.g. ['/gpu:0'].
    sync_replicas: --sync_replicas.
    recipe: the learning rate and optimizer, a machinery.recipe.Recipe.
    opts: the options for speed, a machinery.options.Options.
    measure_noise: measure the gradient noise scale of its towers.

  Returns:
    (train_op, loss, scaffold, the SyncReplicasOptimizer or None).
  """
  num_workers = len(task.worker_hosts)
  # Variables round-robin on the ps tasks' CPUs; everything else on this
  # worker, the towers on its local_devices (no job in them, or the
  # variables, pinned to '/cpu:0', would stay on the worker).
  with tf1.device(tf1.train.replica_device_setter(
      ps_device='/job:ps/cpu:0', worker_device=task.device('/cpu:0'),
      cluster=task.cluster_spec())):
    global_step = tf1.train.get_or_create_global_step()
    # The learning rate counts the examples of one update: with
    # sync_replicas a batch from every worker.
    examples = sum(int(images.shape[0]) for images, _ in batches)
    opt = cifar10.optimizer(cifar10.learning_rate(
        global_step, examples * (num_workers if sync_replicas else 1),
        recipe), recipe, opts)

    # The multi-GPU trainer's towers, averaged on this worker.
    tower_grads, tower_losses = multi.tower_gradients(
        opt, batches, local_devices, recipe, opts)
    grads = multi.average_gradients(tower_grads)

    if sync_replicas:
      # TensorFlow's SyncReplicasOptimizer gathers the workers' gradients
      # on the ps tasks, applies their mean once all have come, and then,
      # on the chief, the moving averages of the variables.
      opt = tf1.train.SyncReplicasOptimizer(
          opt, replicas_to_aggregate=num_workers,
          total_num_replicas=num_workers,
          variable_averages=cifar10.variable_averages(
              global_step, recipe.moving_average_decay),
          variables_to_average=tf1.trainable_variables())
      train_op = opt.apply_gradients(grads, global_step=global_step)
      cifar10.variable_summaries(grads)
      # A run already at --max_steps never checks this op, nor does a
      # graph that is only built: neither is a mistake.
      opt.ready_for_local_init_op.mark_used()
    else:
      # Each worker applies its own gradient as it comes (asynchronous).
      train_op = cifar10.apply_gradients(opt, grads, global_step,
                                         recipe.moving_average_decay)
    # The gradient noise scale of this worker's towers, for TensorBoard.
    train_op = noise_scale.track(train_op, tower_grads, grads,
                                 int(batches[0][0].shape[0]),
                                 measure=measure_noise)
  # The step line reports the last tower's loss, TensorBoard shows its
  # summaries, as the multi-GPU trainer's.
  last = len(local_devices) - 1
  return (train_op, tower_losses[last], tf1.train.Scaffold(
      summary_op=summaries.tower_summary_op(cifar10.TOWER_NAME, last)),
          opt if sync_replicas else None)


def build_allreduce_graph(task, batches, local_devices,
                          recipe=recipes.TUTORIAL, opts=options.DEFAULT,
                          measure_noise=True, peer_timeout_secs=0):
  """Builds a worker's step for all-reduce mode, in the default graph.

  The worker's own variables, on its towers as the multi-GPU trainer's
  --variable_update=replicated has them; one all-reduce over the towers
  of all workers; the chief's values broadcast after initialization.

  Args:
    task: the worker's cluster.Task.
    batches: the towers' (images, labels) pairs, built on the worker's CPU.
    local_devices: the towers' devices on the worker, all distinct.
    recipe: the learning rate and optimizer, a machinery.recipe.Recipe.
    opts: the options for speed, a machinery.options.Options.
    measure_noise: measure the gradient noise scale of all its towers.
    peer_timeout_secs: how long to wait for a peer that does not come
      (--peer_timeout_secs); 0: for ever.

  Returns:
    (train_op, loss, scaffold).
  """
  devices = [task.device(d) for d in local_devices]
  build = cifar10_replicated.builder(devices, multi.tower_loss,
                                     gpus_shared=cluster.gpus_shared(
                                         task, len(local_devices), len(
                                             tf.config.list_physical_devices(
                                                 'GPU'))))
  with tf.device(task.device('/cpu:0')):
    return build(
        batches, devices, recipe, opts, measure_noise,
        num_workers=len(task.worker_hosts),
        broadcast=lambda variables: worker_session.broadcast_from_chief(
            task, variables, peer_timeout_secs),
        timeout_secs=peer_timeout_secs)


def run_training(server, task, mode, local_devices, config,
                 recipe=recipes.TUTORIAL, opts=options.DEFAULT):
  """Trains as this worker until the global step reaches --max_steps (or
  the end of --train_epochs).

  Args:
    server: this worker's tf.distribute.Server.
    task: the worker's cluster.Task; worker 0 is the chief.
    mode: --variable_update as the cluster has it: PARAMETER_SERVER or
      REPLICATED (of cifar10_replicated), all-reduce between workers.
    local_devices: the towers' devices on the worker, e.g. ['/gpu:0'].
    config: the worker's tower ConfigProto (hardware.tower_devices).
    recipe: the learning rate and optimizer, a machinery.recipe.Recipe.
    opts: the options for speed, a machinery.options.Options.

  Returns:
    The number of steps this worker ran.

  Raises:
    errors.PeerGoneError: all-reduce, and a peer is gone.
  """
  all_reduce = mode == cifar10_replicated.REPLICATED
  # This worker's examples a step, and those of one update: with
  # all-reduce or synchronous replicas, every worker's.
  examples_per_step = FLAGS.batch_size * FLAGS.num_gpus
  last = session.last_step(examples_per_step * (
      len(task.worker_hosts) if all_reduce or FLAGS.sync_replicas else 1),
                           recipe)
  role = worker_session.WorkerRole(
      server.target, task, own_variables=all_reduce,
      train_dir=FLAGS.train_dir, max_steps=last,
      peer_timeout_secs=FLAGS.peer_timeout_secs)
  config = cluster.session_config(task, all_reduce, config)
  hooks = role.hooks()
  with tf.Graph().as_default():
    # With --seed, the same run every time; each worker its own batches.
    session.seed_graph(FLAGS.seed, offset=task.task_index)
    # The worker's input pipeline, on its CPU: a batch for each tower.
    with tf.device(task.device('/cpu:0')):
      batches = cifar10.distorted_batches(FLAGS.data_dir, FLAGS.batch_size,
                                          len(local_devices), opts,
                                          FLAGS.hold_out, recipe.cutout,
                                          mixup=recipe.mixup)
    if all_reduce:
      train_op, loss, scaffold = build_allreduce_graph(
          task, batches, local_devices, recipe, opts,
          FLAGS.gradient_noise_scale, FLAGS.peer_timeout_secs)
    else:
      train_op, loss, scaffold, sync = build_worker_graph(
          task, batches, local_devices, FLAGS.sync_replicas, recipe, opts,
          FLAGS.gradient_noise_scale)
      hooks += worker_session.ps_mode_hooks(task, sync,
                                            FLAGS.stall_report_secs)
      if not task.is_chief:
        role.wait_for_chief(config)
    step = role.resume_step(config, scaffold)
    if step is not None and session.reached_max_steps(last, step,
                                                      role.log_prefix):
      return 0

    # The multi-GPU trainer's session and loop, as this worker of the
    # cluster; the step line counts this worker's examples.
    return session.train_until_done(
        train_op, loss, examples_per_step, recipe, num_towers=FLAGS.num_gpus,
        last=last, hooks=hooks, config=config, scaffold=scaffold, role=role,
        log_prefix=role.log_prefix)


def mode_of(task):
  """Chooses how the workers share the variables: PARAMETER_SERVER or
  REPLICATED (all-reduce), the values of --variable_update
  (cifar10_replicated.py).

  An explicit --variable_update must fit the cluster; without one, the
  cluster decides: ps tasks, parameter-server mode; none, all-reduce.

  Raises:
    errors.UsageError: --variable_update does not fit the cluster.
  """
  if not FLAGS['variable_update'].present:
    return (cifar10_replicated.PARAMETER_SERVER if task.ps_hosts
            else cifar10_replicated.REPLICATED)
  if FLAGS.variable_update == cifar10_replicated.REPLICATED and task.ps_hosts:
    raise errors.UsageError(
        '--variable_update=replicated keeps the variables on the workers and '
        'all-reduces between them: give no ps tasks (%d are given, from %s).'
        % (len(task.ps_hosts), task.source))
  if (FLAGS.variable_update == cifar10_replicated.PARAMETER_SERVER and
      not task.ps_hosts):
    raise errors.UsageError(
        '--variable_update=parameter_server needs ps tasks: give '
        '--ps_hosts, or use --variable_update=replicated to all-reduce '
        'between the workers.')
  return FLAGS.variable_update


def main(argv=None):  # pylint: disable=unused-argument
  recipe, opts = recipes.from_flags(), options.from_flags()
  # The cluster: every task's address, and which one this process is.
  task = cluster.from_flags_or_tf_config()
  mode = mode_of(task)
  all_reduce = mode == cifar10_replicated.REPLICATED
  print(task.describe(all_reduce))

  if task.job_name == 'ps':
    # A ps task's server holds the variables the workers place on it and
    # runs the ops they send; the task itself waits until they are done.
    server = cluster.start_server(
        task, cluster.server_config(task, all_reduce, None))
    ps_task.serve(server, task)
    return

  # A worker: its towers' devices, its server, then training.
  session.fit_and_fetch(cifar10, towers=FLAGS.num_gpus)
  local_devices, config = hardware.tower_devices(
      FLAGS.num_gpus, FLAGS.virtual_gpus or all_reduce)
  cluster.take_local_gpus(task, FLAGS.num_gpus, config)
  server = cluster.start_server(
      task, cluster.server_config(task, all_reduce, config))
  try:
    steps = run_training(server, task, mode, local_devices, config, recipe,
                         opts)
  finally:
    if not all_reduce:
      ps_task.say_done(server, task)  # The ps tasks may exit once all have.
  print('Worker %d: done after %d steps of its own (%d examples).'
        % (task.task_index, steps, steps * FLAGS.batch_size * FLAGS.num_gpus))


if __name__ == '__main__':
  cli.run_main(main, defaults={'max_steps': multi.MAX_STEPS})
