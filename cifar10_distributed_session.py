"""A worker's part in the training session of a cluster.

cifar10_session.run_training trains alone unless it is given a role; the
distributed trainer gives each worker a WorkerRole, which tells it where
training resumes and how the worker's session is created:

  role = WorkerRole(server.target, task, own_variables=True)
  cifar10_session.run_training(train_op, loss, ..., role=role,
                               hooks=role.hooks())

Worker 0, the chief, restores the model and writes --train_dir. The other
workers wait for the chief (parameter servers hold the variables), or,
where every worker holds its own variables (all-reduce), initialize them
and take the chief's values by a broadcast; there a lost peer is final
(PeerGoneError) rather than retried for ever, and peer_gone_error() says
which peer and what to do.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import cifar10_checkpoint
import cifar10_cli
import cifar10_cluster
import tensorflow as tf

tf1 = tf.compat.v1
FLAGS = tf1.flags.FLAGS

# Seconds a worker of the ps tasks waits for the chief to initialize.
WORKER_WAIT_SECS = 7200

# The errors of a collective whose peer is gone or hangs.
PEER_ERRORS = (tf.errors.DeadlineExceededError, tf.errors.UnavailableError,
               tf.errors.AbortedError)


class PeerGoneError(Exception):
  """A worker holding its own variables lost the peers it all-reduces with."""


class _FailFastSessionCreator(tf1.train.SessionCreator):
  """Creates sessions with another creator, but takes the errors of a peer
  that is gone as final: MonitoredSession would retry them for ever."""

  def __init__(self, creator):
    self._creator = creator

  def create_session(self):
    try:
      return self._creator.create_session()
    except (tf.errors.UnavailableError, tf.errors.AbortedError) as e:
      raise PeerGoneError(cifar10_cli.tf_reason(e))


class StopIfReachedHook(tf1.train.SessionRunHook):
  """Stops a session that starts at --max_steps or past it before its first
  step (a worker that learns the step only in the session)."""

  def after_create_session(self, session, coord):
    if session.run(tf1.train.get_global_step()) >= FLAGS.max_steps:
      coord.request_stop()


class WorkerRole(object):
  """How a worker of a cluster takes part in cifar10_session.run_training.

  Attributes:
    is_chief: worker 0: it restores the model and writes --train_dir.
  """

  def __init__(self, master, is_chief, own_variables):
    """Args:
      master: this worker's server target.
      is_chief: whether it is worker 0.
      own_variables: every worker holds its own variables and initializes
        them (the scaffold's local_init_op then gives them the chief's
        values); only the chief restores them from --train_dir.
    """
    self.is_chief = is_chief
    self._master = master
    self._own_variables = own_variables

  def resume_step(self, config, scaffold):
    """Where training resumes, writing nothing.

    The chief reads the step from the latest checkpoint in --train_dir (and
    at --max_steps restores it into the cluster: the ps tasks, or its own
    variables and, by the scaffold's local_init_op, the other workers');
    another worker reads it from the variables the chief has set, or, when
    it holds its own, learns it in the session.

    Returns:
      The global step, or None if it is learned only in the session.
    """
    if not self.is_chief:
      if self._own_variables:
        return None
      with tf1.Session(self._master, config=config) as sess:
        return int(sess.run(tf1.train.get_global_step()))
    latest = cifar10_checkpoint.latest_checkpoint(FLAGS.train_dir).path
    step = cifar10_checkpoint.checkpoint_step(latest)
    if step >= FLAGS.max_steps:
      # Restore it into the cluster, so that the other workers learn it too.
      with tf1.Session(self._master, config=config) as sess:
        tf1.train.Saver().restore(sess, latest)
        if self._own_variables:
          sess.run(scaffold.local_init_op)
    return step

  def session_creator(self, scaffold, config):
    """The chief restores or initializes; a worker with its own variables
    initializes them; another waits for the chief. With their own
    variables, a lost peer is final for both."""
    if self.is_chief:
      creator = tf1.train.ChiefSessionCreator(
          scaffold=scaffold, master=self._master, config=config,
          checkpoint_dir=FLAGS.train_dir)
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

  def hooks(self):
    """The hooks the worker's session needs besides run_training's."""
    if self._own_variables and not self.is_chief:
      return [StopIfReachedHook()]
    return []


def peer_gone_error(task):
  """The UsageError of a worker whose all-reduce or broadcast a peer left.

  Args:
    task: the worker's cifar10_cluster.Task.
  """
  gone = cifar10_cluster.unanswered_peers(task)
  if gone:
    waited_for = ('%s after at most %d s: it does not answer (stopped, or '
                  'never started)' % (' and '.join(gone),
                                      FLAGS.peer_timeout_secs))
  else:
    waited_for = ('a peer after at most %d s: %s answer%s but did not take '
                  'part (hung?)' % (
                      FLAGS.peer_timeout_secs, ' and '.join(
                          'worker %d (%s)' % (i, address)
                          for i, address in enumerate(task.worker_hosts)
                          if i != task.task_index),
                      '' if len(task.worker_hosts) > 2 else 's'))
  return cifar10_cli.UsageError(
      'Worker %d: gave up waiting for %s. Restart the whole cluster: it '
      'resumes from the chief\'s latest checkpoint in its --train_dir.'
      % (task.task_index, waited_for))
