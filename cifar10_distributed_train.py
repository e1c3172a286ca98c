"""Trains CIFAR-10 across machines on TensorFlow's distributed runtime.

Parameter-server tasks hold the variables; each worker task runs
--num_gpus towers (the multi-GPU trainer's towers, averaged locally) and
sends the mean gradient to the parameter servers. With --sync_replicas
(the default) a SyncReplicasOptimizer aggregates one gradient from every
worker into each update; without it every worker updates on its own
(asynchronous). Worker 0 is the chief: it initializes or restores the
model and writes checkpoints and summaries to --train_dir.

Usage, 1 ps + 2 workers on one machine (one command per terminal):
  H='--ps_hosts=127.0.0.1:2222 --worker_hosts=127.0.0.1:2223,127.0.0.1:2224'
  python cifar10_distributed_train.py $H --job_name=ps --task_index=0
  python cifar10_distributed_train.py $H --job_name=worker --task_index=0 \\
      --train_dir=/tmp/cifar10_dist --max_steps=300
  python cifar10_distributed_train.py $H --job_name=worker --task_index=1 \\
      --train_dir=/tmp/cifar10_dist --max_steps=300

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

import cifar10  # First: it quiets TensorFlow's start-up logging.
import cifar10_session
import cifar10_multi_gpu_train as multi
import tensorflow as tf

tf1 = tf.compat.v1
flags = tf1.flags
FLAGS = flags.FLAGS

flags.DEFINE_enum('job_name', None, ['ps', 'worker'],
                  'This task\'s job: ps or worker.')
flags.DEFINE_integer('task_index', 0, 'This task\'s index in its job.',
                     lower_bound=0)
flags.DEFINE_list('ps_hosts', [], 'Parameter servers, host:port,...')
flags.DEFINE_list('worker_hosts', [], 'Workers, host:port,...; the first '
                  'is the chief.')
for _hosts in ('ps_hosts', 'worker_hosts'):
  flags.register_validator(
      _hosts, lambda hosts: all(_is_host_port(h) for h in hosts),
      message='give each task as host:port, the port a number 1-65535')
flags.DEFINE_boolean('sync_replicas', True,
                     'Aggregate one gradient from every worker into each '
                     'update; false: every worker updates on its own.')
flags.DEFINE_integer('stall_report_secs', 60,
                     'Report when a step waits longer than this (a worker '
                     'missing in synchronous mode).', lower_bound=1)
flags.adopt_module_key_flags(multi)
flags.adopt_module_key_flags(cifar10)

# Seconds a blocking call waits before checking for Ctrl-C again.
POLL_SECS = 0.5


def _is_host_port(address):
  """Returns whether address reads as host:port."""
  host, _, port = address.rpartition(':')
  return bool(host) and port.isdigit() and 0 < int(port) < 65536


def _done_queue(ps_task, num_workers):
  """The queue on ps task ps_task where each worker puts a done token."""
  with tf.device('/job:ps/task:%d' % ps_task):
    return tf1.FIFOQueue(num_workers, tf.int32,
                         shared_name='done_queue_%d' % ps_task)


def serve_ps(server, num_workers):
  """Serves the variables until every worker has said it is done.

  SIGINT (Ctrl-C) or SIGTERM stops it sooner.

  Args:
    server: this ps task's tf.distribute.Server.
    num_workers: number of worker tasks.
  """
  print('ps task %d serving; it exits when all %d workers are done '
        '(Ctrl-C stops it sooner).' % (FLAGS.task_index, num_workers))
  received = []
  for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, lambda signum, frame: received.append(signum))
  with tf.Graph().as_default():
    dequeue = _done_queue(FLAGS.task_index, num_workers).dequeue()
    config = tf1.ConfigProto(
        device_filters=['/job:ps/task:%d' % FLAGS.task_index])
    sess = tf1.Session(server.target, config=config)

    def count_done():
      for done in range(num_workers):
        sess.run(dequeue)
        print('ps task %d: %d of %d workers done.'
              % (FLAGS.task_index, done + 1, num_workers))
    # The main thread stays in Python, where signals are handled.
    counter = threading.Thread(target=count_done, daemon=True)
    counter.start()
    while counter.is_alive() and not received:
      counter.join(POLL_SECS)
  if received:
    print('ps task %d: stopped by signal %d.'
          % (FLAGS.task_index, received[0]))


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
    except tf.errors.OpError:
      pass  # A ps task that is gone needs no token.


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


def _wait_for_chief(server, task_index):
  """Returns once the chief has initialized or restored the model.

  The training session would check too, but only every 30 seconds.

  Args:
    server: this worker's tf.distribute.Server.
    task_index: the worker's index.
  """
  uninitialized = tf1.report_uninitialized_variables(tf1.global_variables())
  with tf1.Session(server.target, config=session_config(task_index)) as sess:
    if sess.run(uninitialized).size:
      print('Worker %d: waiting for the chief (worker 0) to initialize the '
            'model.' % task_index)
    while sess.run(uninitialized).size:
      time.sleep(POLL_SECS)


def build_worker_graph(cluster, task_index, local_devices, batches=None):
  """Builds worker task_index's graph in the default graph.

  Args:
    cluster: the tf.compat.v1.train.ClusterSpec.
    task_index: the worker's index.
    local_devices: the towers' devices on the worker, e.g. ['/gpu:0'].
    batches: list of (images, labels) per tower; None: the input pipeline.

  Returns:
    A cifar10_multi_gpu_train.TrainGraph.
  """
  num_workers = cluster.num_tasks('worker')
  worker = '/job:worker/task:%d' % task_index

  def sync_optimizer(opt, moving_averages):
    return tf1.train.SyncReplicasOptimizer(
        opt, replicas_to_aggregate=num_workers,
        total_num_replicas=num_workers, variable_averages=moving_averages,
        variables_to_average=tf1.trainable_variables())

  # Variables round-robin on the ps tasks; everything else on this worker,
  # the towers on its local_devices (no job in them, or the variables,
  # pinned to '/cpu:0', would stay on the worker).
  with tf1.device(tf1.train.replica_device_setter(
      worker_device=worker + '/cpu:0', cluster=cluster)):
    if batches is None:
      batches = cifar10.distorted_batches(FLAGS.num_gpus)
    return multi.build_train_op(
        batches, local_devices,
        # One synchronous step takes a batch from every worker.
        num_workers=num_workers if FLAGS.sync_replicas else 1,
        sync_optimizer=sync_optimizer if FLAGS.sync_replicas else None)


def session_config(task_index):
  """The worker's session config: it sees the ps tasks and itself only."""
  config = cifar10_session.session_config()
  config.device_filters.extend(['/job:ps', '/job:worker/task:%d' % task_index])
  return config


def train(server, cluster, task_index, local_devices, make_batches=None,
          init_fn=None):
  """Trains as worker task_index until the global step reaches --max_steps.

  Args:
    server: this worker's tf.distribute.Server.
    cluster: the tf.compat.v1.train.ClusterSpec.
    task_index: the worker's index; 0 is the chief.
    local_devices: the towers' devices on the worker, e.g. ['/gpu:0'].
    make_batches: None for the input pipeline, or a function returning
      the list of (images, labels) per tower (tests).
    init_fn: None, or a function(scaffold, session) the chief runs after
      initializing the variables (tests).

  Returns:
    The number of steps this worker ran.
  """
  is_chief = task_index == 0
  num_workers = cluster.num_tasks('worker')
  with tf.Graph().as_default():
    graph = build_worker_graph(cluster, task_index, local_devices,
                               make_batches() if make_batches else None)
    hooks = [StallReportHook(
        FLAGS.stall_report_secs,
        'Worker %d: a step has waited %d s. In synchronous mode every step '
        'needs all %d workers: start or restart the missing one with its '
        'same flags.' % (task_index, FLAGS.stall_report_secs, num_workers))]
    if FLAGS.sync_replicas:
      # The optimizer's queue runner waits for the next step's gradients
      # when training ends; closing the session cancels it, which is how
      # it ends, not an error to print.
      cifar10_session.quiet_thread_errors(
          lambda args: issubclass(args.exc_type, tf.errors.CancelledError))
      # No tokens to start with: each worker gives one gradient to each
      # update, then waits for the next (the chief could use spare tokens
      # to give two).
      hooks.append(graph.optimizer.make_session_run_hook(is_chief,
                                                         num_tokens=0))
      # The session checks this; a run already at --max_steps starts none.
      graph.optimizer.ready_for_local_init_op.mark_used()
    if not is_chief:
      _wait_for_chief(server, task_index)
    return cifar10_session.run_training(
        graph.train_op, graph.loss,
        examples_per_step=FLAGS.batch_size * FLAGS.num_gpus,
        num_towers=FLAGS.num_gpus,
        config=session_config(task_index),
        scaffold=tf1.train.Scaffold(summary_op=graph.summary_op,
                                    local_init_op=graph.local_init_op,
                                    init_fn=init_fn),
        master=server.target, is_chief=is_chief, hooks=hooks,
        log_prefix='Worker %d: ' % task_index)


def start_server(cluster, job_name, task_index, config):
  """Starts this task's server.

  Args:
    cluster: the tf.compat.v1.train.ClusterSpec.
    job_name: 'ps' or 'worker'.
    task_index: the task's index in its job.
    config: the tf.compat.v1.ConfigProto that sets the task's devices.

  Returns:
    The tf.distribute.Server.

  Raises:
    cifar10_session.UsageError: the task is not in the cluster, or its port is
      taken.
  """
  num_tasks = cluster.num_tasks(job_name)
  if task_index >= num_tasks:
    raise cifar10_session.UsageError(
        '--task_index=%d, but --%s_hosts lists %d task(s).'
        % (task_index, job_name, num_tasks))
  try:
    return tf1.train.Server(cluster, job_name=job_name,
                            task_index=task_index, config=config)
  except (tf.errors.OpError, ValueError) as e:
    raise cifar10_session.UsageError(
        'Cannot start the %s task %d server at %s: %s. Is the port in use?'
        % (job_name, task_index, cluster.task_address(job_name, task_index),
           str(e).splitlines()[0]))


def main(argv=None):  # pylint: disable=unused-argument
  if FLAGS.job_name is None:
    raise cifar10_session.UsageError('Give this task\'s job: --job_name=ps or '
                                     '--job_name=worker.')
  if not FLAGS.ps_hosts or not FLAGS.worker_hosts:
    raise cifar10_session.UsageError(
        'Give the cluster: --ps_hosts=host:port,... and '
        '--worker_hosts=host:port,...')
  if FLAGS.variable_update != 'parameter_server':
    raise cifar10_session.UsageError(
        'Distributed training keeps the variables on the ps tasks: use '
        '--variable_update=parameter_server.')
  cluster = tf1.train.ClusterSpec({'ps': FLAGS.ps_hosts,
                                   'worker': FLAGS.worker_hosts})
  num_workers = len(FLAGS.worker_hosts)
  if FLAGS.job_name == 'worker':
    cifar10.maybe_download_and_extract()
  if FLAGS.job_name == 'ps':
    server = start_server(cluster, 'ps', FLAGS.task_index,
                          cifar10_session.session_config())
    serve_ps(server, num_workers)
    return
  local_devices, config = multi.tower_devices(FLAGS.num_gpus,
                                              FLAGS.virtual_cpus)
  server = start_server(cluster, 'worker', FLAGS.task_index, config)
  try:
    steps = train(server, cluster, FLAGS.task_index, local_devices)
  finally:
    _signal_done(server, len(FLAGS.ps_hosts), num_workers)
  print('Worker %d: done after %d steps of its own (%d examples).'
        % (FLAGS.task_index, steps, steps * FLAGS.batch_size * FLAGS.num_gpus))


if __name__ == '__main__':
  cifar10_session.run_main(main)
