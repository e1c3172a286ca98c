"""Gives a distributed worker its part in the training session of a cluster.

session.training_session trains alone unless it is given a role; the
distributed trainer gives each worker a WorkerRole, which tells where
training resumes, how the worker's session is created and what a lost
peer means:

  role = WorkerRole(server.target, task, own_variables=True,
                    train_dir=..., max_steps=..., peer_timeout_secs=300)
  if session.reached_max_steps(last, role.resume_step(config, scaffold)): ...
  with session.training_session(hooks + role.hooks(), ..., role=role):

Worker 0, the chief, restores the model and writes --train_dir. The other
workers wait for the chief (parameter servers hold the variables:
wait_for_chief), or, where every worker holds its own variables
(all-reduce), initialize them and take the chief's values by a broadcast
(broadcast_from_chief); there a lost peer is final rather than retried for
ever, and peer_gone_error() says which peer and what to do. With
parameter servers, ps_mode_hooks() are the worker's: a notice when a step
waits for a missing worker, and the SyncReplicasOptimizer's own.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import time

from machinery import checkpoints
from machinery import cluster
from machinery import console
from machinery import errors
from machinery import session
from machinery import step_hooks
import tensorflow as tf

tf1 = tf.compat.v1

# Seconds a worker of the ps tasks waits for the chief to initialize.
WORKER_WAIT_SECS = 7200

# Seconds between a waiting worker's checks on the chief.
POLL_SECS = 0.5

# The group of the collectives that broadcast the chief's values (the
# all-reduce of the gradients is group 1, cifar10_replicated.py).
BROADCAST_GROUP = 2

# The errors of a collective whose peer is gone or hangs.
PEER_ERRORS = (tf.errors.DeadlineExceededError, tf.errors.UnavailableError,
               tf.errors.AbortedError)


class _PeerLost(Exception):
  """Ends session creation where a peer is gone: final, not retried."""


class _FailFastSessionCreator(tf1.train.SessionCreator):
  """Creates sessions with another creator, but takes the errors of a peer
  that is gone as final: MonitoredSession would retry them for ever."""

  def __init__(self, creator):
    self._creator = creator

  def create_session(self):
    try:
      return self._creator.create_session()
    except (tf.errors.UnavailableError, tf.errors.AbortedError) as e:
      raise _PeerLost(errors.tf_reason(e))


class StopIfReachedHook(tf1.train.SessionRunHook):
  """Stops a session that starts at its last step or past it before its
  first step, and says so (a worker that learns the step only in the
  session)."""

  def __init__(self, last, log_prefix):
    self._last = last
    self._log_prefix = log_prefix

  def after_create_session(self, session_, coord):
    step = session_.run(tf1.train.get_global_step())
    if session.reached_max_steps(self._last, step, self._log_prefix):
      coord.request_stop()


class WorkerRole(object):
  """Takes part in session.training_session as a worker of a cluster.

  Attributes:
    is_chief: worker 0: it restores the model and writes --train_dir.
    lost_peer_errors: the errors that mean a peer is gone: those of a
      worker that all-reduces with its peers; none with ps tasks.
  """

  def __init__(self, master, task, own_variables, train_dir, max_steps,
               peer_timeout_secs):
    """Makes the role of a worker.

    Args:
      master: this worker's server target.
      task: the worker's cluster.Task.
      own_variables: every worker holds its own variables and initializes
        them (the scaffold's local_init_op then gives them the chief's
        values); only the chief restores them from train_dir.
      train_dir: --train_dir, the chief's.
      max_steps: the step training stops at (session.last_step()).
      peer_timeout_secs: how long a collective waits for a peer, for the
        line that says one is gone.
    """
    self.is_chief = task.is_chief
    self.lost_peer_errors = (PEER_ERRORS + (_PeerLost,) if own_variables
                             else ())
    self._master = master
    self._task = task
    self._own_variables = own_variables
    self._train_dir = train_dir
    self._max_steps = max_steps
    self._peer_timeout_secs = peer_timeout_secs

  def resume_step(self, config, scaffold):
    """Tells where training resumes, writing nothing.

    The chief reads the step from the latest checkpoint in --train_dir (and
    at --max_steps restores it into the cluster: the ps tasks, or its own
    variables and, by the scaffold's local_init_op, the other workers');
    another worker reads it from the variables the chief has set, or, when
    it holds its own, learns it in the session (StopIfReachedHook).

    Returns:
      The global step, or None if it is learned only in the session.

    Raises:
      errors.PeerGoneError: all-reduce, and a peer is gone.
    """
    if not self.is_chief:
      if self._own_variables:
        return None
      with tf1.Session(self._master, config=config) as sess:
        return int(sess.run(tf1.train.get_global_step()))
    latest = checkpoints.latest_checkpoint(self._train_dir).path
    step = checkpoints.checkpoint_step(latest)
    if step >= self._max_steps:
      # Restore it into the cluster, so that the other workers learn it too.
      try:
        with tf1.Session(self._master, config=config) as sess:
          tf1.train.Saver().restore(sess, latest)
          if self._own_variables:
            sess.run(scaffold.local_init_op)  # The broadcast to the others.
      except self.lost_peer_errors:
        raise self.peer_gone_error()
    return step

  def session_creator(self, scaffold, config):
    """Creates the session: the chief restores or initializes; a worker with
    its own variables initializes them; another waits for the chief. With
    their own variables, a lost peer is final for both."""
    if self.is_chief:
      creator = tf1.train.ChiefSessionCreator(
          scaffold=scaffold, master=self._master, config=config,
          checkpoint_dir=self._train_dir)
    elif self._own_variables:
      creator = tf1.train.ChiefSessionCreator(
          scaffold=scaffold, master=self._master, config=config)
    else:
      creator = tf1.train.WorkerSessionCreator(
          scaffold=scaffold, master=self._master, config=config,
          max_wait_secs=WORKER_WAIT_SECS)
    if self._own_variables:
      creator = _FailFastSessionCreator(creator)
    return creator

  def wait_for_chief(self, config):
    """Returns once the chief has initialized or restored the model on the
    ps tasks (the training session would check too, but only every 30
    seconds).

    Args:
      config: the worker's session config.
    """
    uninitialized = tf1.report_uninitialized_variables(
        tf1.global_variables())
    with tf1.Session(self._master, config=config) as sess:
      if sess.run(uninitialized).size:
        print('Worker %d: waiting for the chief (worker 0) to initialize the '
              'model.' % self._task.task_index)
      while sess.run(uninitialized).size:
        time.sleep(POLL_SECS)

  def hooks(self):
    """Returns the hooks the worker's session needs besides the trainer's."""
    if self._own_variables and not self.is_chief:
      return [StopIfReachedHook(self._max_steps, self.log_prefix)]
    return []

  @property
  def log_prefix(self):
    """Starts each of the worker's lines: 'Worker 1: '."""
    return 'Worker %d: ' % self._task.task_index

  def peer_gone_error(self):
    """Makes the errors.PeerGoneError of a worker whose all-reduce or
    broadcast a peer left: which peer, and what to do."""
    task = self._task
    gone = cluster.unanswered_peers(task)
    if gone:
      waited_for = ('%s after at most %d s: it does not answer (stopped, or '
                    'never started)' % (' and '.join(gone),
                                        self._peer_timeout_secs))
    else:
      waited_for = ('a peer after at most %d s: %s answer%s but did not take '
                    'part (hung?)' % (
                        self._peer_timeout_secs, ' and '.join(
                            'worker %d (%s)' % (i, address)
                            for i, address in enumerate(task.worker_hosts)
                            if i != task.task_index),
                        '' if len(task.worker_hosts) > 2 else 's'))
    return errors.PeerGoneError(
        'Worker %d: gave up waiting for %s. Restart the whole cluster: it '
        'resumes from the chief\'s latest checkpoint in its --train_dir.'
        % (task.task_index, waited_for))


def ps_mode_hooks(task, sync_optimizer, stall_report_secs):
  """Makes a worker's hooks in parameter-server mode: the stall report,
  and with --sync_replicas the optimizer's (it also readies the queues).

  Args:
    task: the worker's cluster.Task.
    sync_optimizer: the graph's SyncReplicasOptimizer, or None.
    stall_report_secs: after how long a waiting step is reported.

  Returns:
    A list of SessionRunHooks.
  """
  hooks = [step_hooks.StallReportHook(
      stall_report_secs,
      'Worker %d: a step has waited %d s. In synchronous mode every step '
      'needs all %d workers: start or restart the missing one with its '
      'same flags.' % (task.task_index, stall_report_secs,
                       len(task.worker_hosts)))]
  if sync_optimizer:
    # The optimizer's queue runner waits for the next step's gradients
    # when training ends; closing the session cancels it, which is how it
    # ends, not an error to print.
    console.quiet_thread_errors(
        lambda args: issubclass(args.exc_type, tf.errors.CancelledError))
    # No tokens to start with: each worker gives one gradient to each
    # update, then waits for the next (the chief could use spare tokens to
    # give two).
    hooks.append(sync_optimizer.make_session_run_hook(task.is_chief,
                                                      num_tokens=0))
  return hooks


def broadcast_from_chief(task, variables, timeout_secs):
  """Makes the op that gives every worker the chief's values of variables.

  A collective broadcast on each worker's CPU, a variable at a time, in
  the order of the list, which is the same on every worker (they build the
  same graph). The chief sends; the others receive and assign.

  Args:
    task: this worker's cluster.Task.
    variables: the global variables.
    timeout_secs: how long to wait for a peer that does not come.

  Returns:
    The op.
  """
  common = dict(group_size=len(task.worker_hosts), group_key=BROADCAST_GROUP,
                timeout_seconds=float(timeout_secs))
  ops = []
  with tf.device(task.device('/cpu:0')), tf1.name_scope('broadcast'):
    for key, var in enumerate(variables):
      if task.is_chief:
        ops.append(tf.raw_ops.CollectiveBcastSendV2(
            input=var.read_value(), instance_key=key + 1, **common))
      else:
        ops.append(var.assign(tf.raw_ops.CollectiveBcastRecvV2(
            T=var.dtype.base_dtype, shape=var.shape.as_list(),
            instance_key=key + 1, **common)))
  return tf.group(*ops)
