"""Gives a distributed worker its part in the training session of a cluster.

session.training_session trains alone unless it is given a role; the
distributed trainer gives each worker a WorkerRole, which tells where
training resumes, how the worker's session is created and what a lost
peer means:

  role = WorkerRole(server.target, task, own_variables=True)
  if session.reached_max_steps(role.resume_step(config, scaffold)): ...
  with session.training_session(hooks + role.hooks(), ..., role=role):

Worker 0, the chief, restores the model and writes --train_dir. The other
workers wait for the chief (parameter servers hold the variables), or,
where every worker holds its own variables (all-reduce), initialize them
and take the chief's values by a broadcast; there a lost peer is final
rather than retried for ever, and peer_gone_error() says which peer and
what to do.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

from machinery import checkpoints
from machinery import cluster
from machinery import errors
from machinery import session
import tensorflow as tf

tf1 = tf.compat.v1
FLAGS = tf1.flags.FLAGS

# Seconds a worker of the ps tasks waits for the chief to initialize.
WORKER_WAIT_SECS = 7200

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
  """Stops a session that starts at --max_steps or past it before its first
  step, and says so (a worker that learns the step only in the session)."""

  def __init__(self, log_prefix):
    self._log_prefix = log_prefix

  def after_create_session(self, session_, coord):
    step = session_.run(tf1.train.get_global_step())
    if session.reached_max_steps(step, self._log_prefix):
      coord.request_stop()


class WorkerRole(object):
  """Takes part in session.training_session as a worker of a cluster.

  Attributes:
    is_chief: worker 0: it restores the model and writes --train_dir.
    lost_peer_errors: the errors that mean a peer is gone: those of a
      worker that all-reduces with its peers; none with ps tasks.
  """

  def __init__(self, master, task, own_variables):
    """Makes the role of a worker.

    Args:
      master: this worker's server target.
      task: the worker's cluster.Task.
      own_variables: every worker holds its own variables and initializes
        them (the scaffold's local_init_op then gives them the chief's
        values); only the chief restores them from --train_dir.
    """
    self.is_chief = task.is_chief
    self.lost_peer_errors = (PEER_ERRORS + (_PeerLost,) if own_variables
                             else ())
    self._master = master
    self._task = task
    self._own_variables = own_variables

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
    latest = checkpoints.latest_checkpoint(FLAGS.train_dir).path
    step = checkpoints.checkpoint_step(latest)
    if step >= FLAGS.max_steps:
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
    """Returns the hooks the worker's session needs besides the trainer's."""
    if self._own_variables and not self.is_chief:
      return [StopIfReachedHook(self.log_prefix)]
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
                                        FLAGS.peer_timeout_secs))
    else:
      waited_for = ('a peer after at most %d s: %s answer%s but did not take '
                    'part (hung?)' % (
                        FLAGS.peer_timeout_secs, ' and '.join(
                            'worker %d (%s)' % (i, address)
                            for i, address in enumerate(task.worker_hosts)
                            if i != task.task_index),
                        '' if len(task.worker_hosts) > 2 else 's'))
    return errors.PeerGoneError(
        'Worker %d: gave up waiting for %s. Restart the whole cluster: it '
        'resumes from the chief\'s latest checkpoint in its --train_dir.'
        % (task.task_index, waited_for))
