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

import signal
import threading
import time

import cifar10
import cifar10_multi_gpu_train as multi
import cifar10_replicated
from machinery import cli
from machinery import cluster
from machinery import console
from machinery import errors
from machinery import hardware
from machinery import session
from machinery import step_hooks
from machinery import summaries
from machinery import worker_session
import tensorflow as tf

tf1 = tf.compat.v1
flags = tf1.flags
FLAGS = flags.FLAGS

flags.DEFINE_enum('job_name', None, ['ps', 'worker'],
                  'This task\'s job: ps or worker (or TF_CONFIG\'s task).')
flags.DEFINE_integer('task_index', 0, 'This task\'s index in its job.',
                     lower_bound=0)
flags.DEFINE_list('ps_hosts', [], 'Parameter servers, host:port,...; none: '
                  'the workers all-reduce.')
flags.DEFINE_list('worker_hosts', [], 'Workers, host:port,...; the first '
                  'is the chief. Without host lists: TF_CONFIG\'s cluster.')
for _hosts in ('ps_hosts', 'worker_hosts'):
  flags.register_validator(
      _hosts, lambda hosts: all(cluster.is_host_port(h)
                                for h in hosts),
      message='give each task as host:port, the port a number 1-65535')
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
flags.adopt_module_key_flags(multi)
flags.adopt_module_key_flags(cifar10)

# Seconds a blocking call waits before checking for Ctrl-C again.
POLL_SECS = 0.5


def _done_queue(ps_task, num_workers):
  """Makes the queue on ps task ps_task where each worker puts a done
  token."""
  with tf.device('/job:ps/task:%d' % ps_task):
    return tf1.FIFOQueue(num_workers, tf.int32,
                         shared_name='done_queue_%d' % ps_task)


def serve_ps(server, task_index, num_workers):
  """Serves the variables until every worker has said it is done.

  SIGINT (Ctrl-C) or SIGTERM stops it sooner.

  Args:
    server: this ps task's tf.distribute.Server.
    task_index: the ps task's index.
    num_workers: number of worker tasks.
  """
  received = []
  for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, lambda signum, frame: received.append(signum))
  with tf.Graph().as_default():
    dequeue = _done_queue(task_index, num_workers).dequeue()
    config = tf1.ConfigProto(
        device_filters=['/job:ps/task:%d' % task_index])
    sess = tf1.Session(server.target, config=config)

    def count_done():
      try:
        for done in range(num_workers):
          sess.run(dequeue)
          print('ps task %d: %d of %d workers done.'
                % (task_index, done + 1, num_workers))
      except tf.errors.CancelledError:
        pass  # The session was closed: stopped by a signal.
    print('ps task %d serving; it exits when all %d workers are done '
          '(Ctrl-C stops it sooner).' % (task_index, num_workers))
    # The main thread stays in Python, where signals are handled.
    counter = threading.Thread(target=count_done, daemon=True)
    counter.start()
    while counter.is_alive() and not received:
      counter.join(POLL_SECS)
    # Closing the session ends the wait in the thread, which must not be
    # in TensorFlow when the interpreter exits.
    sess.close()
    counter.join()
  if received:
    print('ps task %d: stopped by signal %d.'
          % (task_index, received[0]))


def _signal_done(server, num_ps, num_workers):
  """Puts this worker's done token on every ps task's queue."""
  with tf.Graph().as_default():
    enqueues = [_done_queue(i, num_workers).enqueue(1) for i in range(num_ps)]
    # The session needs the ps tasks only, not the other workers, which
    # may have gone.
    config = tf1.ConfigProto(device_filters=['/job:ps'])
    try:
      with tf1.Session(server.target, config=config) as sess:
        sess.run(enqueues, options=tf1.RunOptions(timeout_in_ms=10000))
    except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
            tf.errors.AbortedError):
      pass  # A ps task that is gone (or hangs) needs no token.


class StallReportHook(tf1.train.SessionRunHook):
  """Prints a notice when one step waits longer than a limit."""

  def __init__(self, seconds, message):
    self._seconds = seconds
    self._message = message
    self._timer = None

  def before_run(self, run_context):
    self._timer = threading.Timer(self._seconds, print, [self._message])
    self._timer.daemon = True
    self._timer.start()

  def after_run(self, run_context, run_values):
    self._timer.cancel()

  def end(self, session):
    if self._timer:
      self._timer.cancel()


def _wait_for_chief(server, task, config):
  """Returns once the chief has initialized or restored the model (ps mode).

  The training session would check too, but only every 30 seconds.

  Args:
    server: this worker's tf.distribute.Server.
    task: the worker's cluster.Task.
    config: its session config.
  """
  uninitialized = tf1.report_uninitialized_variables(tf1.global_variables())
  with tf1.Session(server.target, config=config) as sess:
    if sess.run(uninitialized).size:
      print('Worker %d: waiting for the chief (worker 0) to initialize the '
            'model.' % task.task_index)
    while sess.run(uninitialized).size:
      time.sleep(POLL_SECS)


class SyncReplicas(object):
  """Makes one update from a gradient of every worker (--sync_replicas).

  TensorFlow's SyncReplicasOptimizer gathers the workers' gradients on the
  ps tasks, applies their mean once all have come, and then, on the chief,
  the moving averages of the variables.

  Attributes:
    optimizer: the SyncReplicasOptimizer, once apply_gradients has run.
  """

  def __init__(self, num_workers):
    self._num_workers = num_workers
    self.optimizer = None

  def apply_gradients(self, opt, grads, global_step):
    """Applies the mean of every worker's gradients as one update (as
    cifar10.apply_gradients does one worker's), the moving averages on
    the chief."""
    self.optimizer = tf1.train.SyncReplicasOptimizer(
        opt, replicas_to_aggregate=self._num_workers,
        total_num_replicas=self._num_workers,
        variable_averages=cifar10.variable_averages(global_step),
        variables_to_average=tf1.trainable_variables())
    train_op = self.optimizer.apply_gradients(grads, global_step=global_step)
    # The session checks this op; a run already at --max_steps checks none,
    # and a graph only built (tests) none either: neither is a mistake.
    self.optimizer.ready_for_local_init_op.mark_used()
    cifar10.variable_summaries(grads)
    return train_op


def build_worker_graph(task, local_devices, batches=None):
  """Builds a worker's graph for parameter-server mode, in the default graph.

  The multi-GPU trainer's towers and average on the worker; the variables
  on the ps tasks; with --sync_replicas, one update from every worker.

  Args:
    task: the worker's cluster.Task.
    local_devices: the towers' devices on the worker, e.g. ['/gpu:0'].
    batches: list of (images, labels) per tower; None: the input pipeline.

  Returns:
    (train_op, loss, scaffold, the SyncReplicas or None).
  """
  num_workers = len(task.worker_hosts)
  worker = '/job:worker/task:%d' % task.task_index
  sync = SyncReplicas(num_workers) if FLAGS.sync_replicas else None
  # Variables round-robin on the ps tasks' CPUs; everything else on this
  # worker, the towers on its local_devices (no job in them, or the
  # variables, pinned to '/cpu:0', would stay on the worker).
  with tf1.device(tf1.train.replica_device_setter(
      ps_device='/job:ps/cpu:0', worker_device=worker + '/cpu:0',
      cluster=task.cluster_spec())):
    if batches is None:
      batches = cifar10.distorted_batches(FLAGS.num_gpus)
    global_step = tf1.train.get_or_create_global_step()
    # The learning rate counts the examples of one update: with
    # --sync_replicas a batch from every worker.
    examples_per_step = sum(int(images.shape[0]) for images, _ in batches)
    opt = cifar10.optimizer(cifar10.learning_rate(
        global_step, examples_per_step * (num_workers if sync else 1)))
    # The multi-GPU trainer's towers, averaged on this worker.
    tower_grads, loss, scope = multi.tower_gradients(opt, batches,
                                                     local_devices)
    grads = multi.average_gradients(tower_grads)
    apply_gradients = sync.apply_gradients if sync else cifar10.apply_gradients
    train_op = apply_gradients(opt, grads, global_step)
    return train_op, loss, tf1.train.Scaffold(summary_op=(
        summaries.tower_summary_op(scope, cifar10.TOWER_NAME))), sync


def _on_worker(task, device):
  """Names device ('/gpu:1') on this worker:
  '/job:worker/task:i/device:GPU:1'."""
  return tf.DeviceSpec.from_string(
      '/job:worker/task:%d' % task.task_index).make_merged_spec(
          tf.DeviceSpec.from_string(device)).to_string()


def broadcast_from_chief(task, variables):
  """Makes the op that gives every worker the chief's values of variables.

  A collective broadcast on each worker's CPU, a variable at a time, in
  the order of the list, which is the same on every worker (they build the
  same graph). The chief sends; the others receive and assign.

  Args:
    task: this worker's cluster.Task.
    variables: the global variables.

  Returns:
    The op.
  """
  common = dict(group_size=len(task.worker_hosts), group_key=2,
                timeout_seconds=float(FLAGS.peer_timeout_secs))
  ops = []
  with tf.device(_on_worker(task, '/cpu:0')), tf1.name_scope('broadcast'):
    for key, var in enumerate(variables):
      if task.is_chief:
        ops.append(tf.raw_ops.CollectiveBcastSendV2(
            input=var.read_value(), instance_key=key + 1, **common))
      else:
        ops.append(var.assign(tf.raw_ops.CollectiveBcastRecvV2(
            T=var.dtype.base_dtype, shape=var.shape.as_list(),
            instance_key=key + 1, **common)))
  return tf.group(*ops)


def build_allreduce_graph(task, local_devices, batches=None):
  """Builds a worker's graph for all-reduce mode, in the default graph.

  The worker's own variables, on its towers as the multi-GPU trainer's
  --variable_update=replicated has them; one all-reduce over the towers
  of all workers; the chief's values broadcast after initialization.

  Args:
    task: the worker's cluster.Task.
    local_devices: the towers' devices on the worker, all distinct.
    batches: list of (images, labels) per tower; None: the input pipeline.

  Returns:
    (train_op, loss, scaffold).
  """
  with tf.device(_on_worker(task, '/cpu:0')):
    if batches is None:
      batches = cifar10.distorted_batches(FLAGS.num_gpus)
    return cifar10_replicated.build_train_op(
        batches, [_on_worker(task, d) for d in local_devices],
        multi.tower_loss, num_workers=len(task.worker_hosts),
        broadcast=lambda variables: broadcast_from_chief(task, variables),
        timeout_secs=FLAGS.peer_timeout_secs,
        gpus_shared=cluster.gpus_shared(
            task, FLAGS.num_gpus,
            len(tf.config.list_physical_devices('GPU'))))


def _ps_mode_hooks(task, sync):
  """Makes the parameter-server mode's hooks: the stall report, and with
  --sync_replicas the optimizer's (it also readies the queues).

  Args:
    task: the worker's cluster.Task.
    sync: the graph's SyncReplicas, or None.

  Returns:
    A list of SessionRunHooks.
  """
  num_workers = len(task.worker_hosts)
  hooks = [StallReportHook(
      FLAGS.stall_report_secs,
      'Worker %d: a step has waited %d s. In synchronous mode every step '
      'needs all %d workers: start or restart the missing one with its '
      'same flags.' % (task.task_index, FLAGS.stall_report_secs,
                       num_workers))]
  if sync:
    # The optimizer's queue runner waits for the next step's gradients
    # when training ends; closing the session cancels it, which is how it
    # ends, not an error to print.
    console.quiet_thread_errors(
        lambda args: issubclass(args.exc_type, tf.errors.CancelledError))
    # No tokens to start with: each worker gives one gradient to each
    # update, then waits for the next (the chief could use spare tokens to
    # give two).
    hooks.append(sync.optimizer.make_session_run_hook(task.is_chief,
                                                      num_tokens=0))
  return hooks


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


def train(server, task, mode, local_devices, config, make_batches=None,
          hooks=()):
  """Trains as this worker until the global step reaches --max_steps.

  Args:
    server: this worker's tf.distribute.Server.
    task: the worker's cluster.Task; worker 0 is the chief.
    mode: --variable_update as the cluster has it: PARAMETER_SERVER or
      REPLICATED (of cifar10_replicated), all-reduce between workers.
    local_devices: the towers' devices on the worker, e.g. ['/gpu:0'].
    config: the worker's tower ConfigProto (hardware.tower_devices).
    make_batches: None for the input pipeline, or a function returning
      the list of (images, labels) per tower (tests).
    hooks: more SessionRunHooks (tests).

  Returns:
    The number of steps this worker ran.

  Raises:
    errors.PeerGoneError: all-reduce, and a peer is gone.
  """
  all_reduce = mode == cifar10_replicated.REPLICATED
  role = worker_session.WorkerRole(server.target, task,
                                   own_variables=all_reduce)
  config = cluster.session_config(task, all_reduce, config)
  hooks = list(hooks) + role.hooks()
  with tf.Graph().as_default():
    # With --seed, the same run every time; each worker its own batches.
    session.seed_graph(offset=task.task_index)
    batches = make_batches() if make_batches else None
    if all_reduce:
      train_op, loss, scaffold = build_allreduce_graph(task, local_devices,
                                                       batches)
    else:
      train_op, loss, scaffold, sync = build_worker_graph(task, local_devices,
                                                          batches)
      hooks += _ps_mode_hooks(task, sync)
      if not task.is_chief:
        _wait_for_chief(server, task, config)
    step = role.resume_step(config, scaffold)
    if step is not None and session.reached_max_steps(step, role.log_prefix):
      return 0

    # The multi-GPU trainer's session and loop, as this worker of the
    # cluster; the step line counts this worker's examples.
    steps = 0
    with session.training_session(
        hooks=hooks + [
            tf1.train.StopAtStepHook(last_step=FLAGS.max_steps),
            step_hooks.NanLossHook(loss),
            step_hooks.LoggerHook(
                loss, FLAGS.log_frequency,
                examples_per_step=FLAGS.batch_size * FLAGS.num_gpus,
                num_towers=FLAGS.num_gpus, prefix=role.log_prefix)],
        config=config, scaffold=scaffold, role=role,
        log_prefix=role.log_prefix) as mon_sess:
      while not mon_sess.should_stop():
        mon_sess.run(train_op)
        steps += 1
    return steps


def main(argv=None):  # pylint: disable=unused-argument
  task = cluster.from_flags_or_tf_config()
  mode = mode_of(task)
  all_reduce = mode == cifar10_replicated.REPLICATED
  print(task.describe(all_reduce))
  num_workers = len(task.worker_hosts)
  if task.job_name == 'ps':
    server = cluster.start_server(
        task, cluster.server_config(task, all_reduce, None))
    serve_ps(server, task.task_index, num_workers)
    return
  cifar10.maybe_download_and_extract()
  local_devices, config = hardware.tower_devices(
      FLAGS.num_gpus, FLAGS.virtual_gpus or all_reduce)
  gpus = cluster.local_gpus(
      task, FLAGS.num_gpus, len(tf.config.list_physical_devices('GPU')))
  if gpus:
    config.gpu_options.visible_device_list = gpus
    print('Worker %d: GPUs %s of this machine, which it shares with other '
          'workers.' % (task.task_index, gpus))
  server = cluster.start_server(
      task, cluster.server_config(task, all_reduce, config))
  try:
    steps = train(server, task, mode, local_devices, config)
  finally:
    if not all_reduce:
      _signal_done(server, len(task.ps_hosts), num_workers)
  print('Worker %d: done after %d steps of its own (%d examples).'
        % (task.task_index, steps, steps * FLAGS.batch_size * FLAGS.num_gpus))


if __name__ == '__main__':
  cli.run_main(main)
