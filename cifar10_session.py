"""The training session and the command line that the scripts share.

Every script runs through run_main, which parses its flags, checks its
directory flags and reports a user's mistake as one `Error:` line. The
trainers define their flags with define_trainer_flags and train with
run_training, a MonitoredSession over --train_dir with the
tutorial's hooks:

  define_trainer_flags(max_steps=100000)

  def main(argv):
    train_op, loss = ...  # built with cifar10.py
    run_training(train_op, loss, examples_per_step=FLAGS.batch_size,
                 config=session_config())

  if __name__ == '__main__':
    run_main(main)
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import fcntl
import functools
import os
import re
import socket
import sys
import threading

import cifar10  # First: it quiets TensorFlow's start-up logging.
import cifar10_checkpoint
import cifar10_hooks
import cifar10_input
from absl import app  # pylint: disable=g-bad-import-order
import tensorflow as tf

tf1 = tf.compat.v1
flags = tf1.flags
FLAGS = flags.FLAGS

# Seconds the training session waits for its threads at the end.
STOP_GRACE_PERIOD_SECS = 5

# Seconds a worker of the ps tasks waits for the chief to initialize.
WORKER_WAIT_SECS = 7200

# The file in --train_dir that the training process holds a lock on.
LOCK_FILE = 'trainer.lock'

# The flags, of any script, that name directories, checked before work.
PATH_FLAGS = ('data_dir', 'train_dir', 'checkpoint_dir', 'eval_dir',
              'export_dir')

# absl's flags that print the help and exit.
HELP_FLAGS = ('help', '?', 'helpfull', 'helpshort', 'helpxml')


class UsageError(Exception):
  """A mistake of the user's, reported as one line without a traceback."""


def define_trainer_flags(max_steps):
  """Defines the flags both trainers take.

  Args:
    max_steps: the default of --max_steps.
  """
  if 'train_dir' in FLAGS:
    return  # Both trainers imported into one process (tests).
  flags.DEFINE_string('train_dir', '/tmp/cifar10_train',
                      'Directory where to write event logs and checkpoints. '
                      'It is never deleted: a rerun resumes from it.')
  flags.DEFINE_integer('max_steps', max_steps,
                       'Number of batches to run (the global step to stop at).',
                       lower_bound=1)
  flags.DEFINE_boolean('log_device_placement', False,
                       'Whether to log device placement.')
  flags.DEFINE_integer('log_frequency', 10,
                       'How often to log results to the console.',
                       lower_bound=1)
  flags.DEFINE_integer('save_checkpoint_steps', 1000,
                       'Save a checkpoint every this many steps (and at the '
                       'end, and on Ctrl-C or SIGTERM).', lower_bound=1)
  flags.DEFINE_integer('save_summaries_steps', 100,
                       'Write TensorBoard summaries every this many steps.',
                       lower_bound=1)


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
      raise PeerGoneError(str(e).splitlines()[0])


def reached_max_steps(step, log_prefix=''):
  """Says so in one line when training has reached --max_steps.

  Args:
    step: the global step training would resume from; None: the step of
      the latest checkpoint in --train_dir.
    log_prefix: text to start the line with.

  Returns:
    Whether step is at or past --max_steps.
  """
  if step is None:
    step = cifar10_checkpoint.checkpoint_step(
        cifar10_checkpoint.latest_checkpoint(FLAGS.train_dir).path)
  if step < FLAGS.max_steps:
    return False
  print('%sTraining in %s has reached step %d, --max_steps is %d: nothing '
        'to do. To train on, run again with a higher --max_steps.'
        % (log_prefix, FLAGS.train_dir, step, FLAGS.max_steps))
  return True


def _step_reached(master, is_chief, config, scaffold, own_variables):
  """Where training resumes, writing nothing.

  The chief reads the step from the latest checkpoint in --train_dir (and
  at --max_steps restores it into the cluster: the ps tasks, or its own
  variables and, by the scaffold's local_init_op, the other workers');
  another worker reads it from the variables the chief has set, or, when
  it holds its own, learns it in the session. Arguments as run_training's.

  Returns:
    (global step or None if not known yet, the chief's latest checkpoint or
    None).
  """
  if not is_chief:
    if own_variables:
      return None, None
    with tf1.Session(master, config=config) as sess:
      return int(sess.run(tf1.train.get_global_step())), None
  latest = cifar10_checkpoint.latest_checkpoint(FLAGS.train_dir).path
  step = cifar10_checkpoint.checkpoint_step(latest)
  if master and step >= FLAGS.max_steps:
    # Restore it into the cluster, so that the other workers learn it too.
    with tf1.Session(master, config=config) as sess:
      tf1.train.Saver().restore(sess, latest)
      if own_variables:
        sess.run(scaffold.local_init_op)
  return step, latest


def _lock_train_dir(train_dir):
  """Takes the lock that keeps a second trainer out of train_dir.

  An flock on train_dir/LOCK_FILE, which names its holder; the kernel
  releases it when the process ends, even by kill -9. Local paths only.

  Returns:
    The open lock file, to close when training ends, or None.

  Raises:
    UsageError: another live process holds the lock.
  """
  if '://' in train_dir:
    return None
  os.makedirs(train_dir, exist_ok=True)
  lock = open(os.path.join(train_dir, LOCK_FILE), 'a+')
  try:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError:
    lock.seek(0)
    holder = lock.read().strip() or 'another process'
    lock.close()
    raise UsageError(
        '--train_dir=%s is in use by %s. Wait for it to end or stop it, or '
        'train in another --train_dir.' % (train_dir, holder))
  lock.truncate(0)
  lock.write('process %d on %s (%s)\n' % (os.getpid(), socket.gethostname(),
                                          ' '.join(sys.argv)))
  lock.flush()
  return lock


# TensorFlow reports a failed file write as '<path>; <reason>'.
_FAILED_WRITE = re.compile(r'(\S+); ([^\n\[]+)')


def _failed_write(error, train_dir):
  """Reads a failed write into train_dir out of the error training stopped
  with, and removes what it left half-written.

  Returns:
    (what, reason): what failed to be written, and why; or None if error
    is not a failed write into train_dir.
  """
  match = _FAILED_WRITE.search(str(error))
  if not match or not match.group(1).startswith(train_dir.rstrip('/') + '/'):
    return None
  path, reason = match.group(1), match.group(2).strip()
  checkpoint = re.match(r'.*model\.ckpt-\d+', path)
  if checkpoint:
    temporary = checkpoint.group(0) + '_temp'  # The saver writes here first.
    if tf.io.gfile.isdir(temporary):
      tf.io.gfile.rmtree(temporary)
    return 'the checkpoint ' + checkpoint.group(0), reason
  if '.tmp' in os.path.basename(path) and tf.io.gfile.exists(path):
    tf.io.gfile.remove(path)
  if '.tfevents.' in path:
    return 'the event file ' + path, reason
  return path, reason


@functools.lru_cache(maxsize=None)
def _quiet_session_noise():
  """Keeps two messages of TensorFlow's training session off the console.

  The event writer thread's failed writes: the thread logs the error and
  prints its traceback; the main thread gets the same error at its next
  write, and run_training makes it one line. And the deprecation notice
  of get_checkpoint_mtimes, which the session's restore calls on every
  resume.
  """
  tf.get_logger().addFilter(
      lambda record: not any(text in record.getMessage() for text in (
          'writer thread error', 'get_checkpoint_mtimes')))
  quiet_thread_errors(lambda args: args.thread.name == 'EventLoggerThread')


def quiet_thread_errors(is_expected):
  """Keeps the tracebacks of thread errors for which is_expected(args) (of
  threading.excepthook) is True off the console."""
  default_hook = threading.excepthook

  def hook(args):
    if not is_expected(args):
      default_hook(args)
  threading.excepthook = hook


def run_training(train_op, loss, examples_per_step, num_towers=1,
                 config=None, scaffold=None, master='', is_chief=True,
                 own_variables=False, hooks=(), log_prefix=''):
  """Runs train_op in a MonitoredSession over --train_dir.

  Resumes from the latest checkpoint there, stops at --max_steps, logs
  every --log_frequency steps, writes summaries and checkpoints, and on
  SIGINT/SIGTERM saves a checkpoint and stops. Does nothing when the
  checkpoint is at --max_steps already. The chief holds a lock on
  --train_dir while it trains, so no second trainer writes there.

  Args:
    train_op: the op for one step.
    loss: the loss tensor to log and check for NaN.
    examples_per_step: examples one step consumes over all towers.
    num_towers: towers per step, for the sec/batch figure.
    config: a tf.compat.v1.ConfigProto, or None.
    scaffold: a tf.compat.v1.train.Scaffold (for a summary op other than
      all summaries), or None.
    master: the TensorFlow server to run on; '' runs in this process.
    is_chief: whether this task initializes or restores the model and
      writes checkpoints and summaries (distributed training).
    own_variables: every worker holds its own variables and initializes
      them (the scaffold's local_init_op then gives them the chief's
      values); only the chief restores them from --train_dir.
    hooks: more SessionRunHooks.
    log_prefix: text to start each step line with.

  Returns:
    The number of steps this process ran.

  Raises:
    UsageError: the loss became NaN, a write into --train_dir failed, or
      another trainer holds --train_dir.
  """
  train_dir = FLAGS.train_dir
  scaffold = scaffold or tf1.train.Scaffold()
  step, latest = _step_reached(master, is_chief, config, scaffold,
                               own_variables)
  if step is not None and reached_max_steps(step, log_prefix):
    return 0
  lock = _lock_train_dir(train_dir) if is_chief else None
  resumed_step = None
  if is_chief:
    # What is on disk and readable, with the index file saying so.
    latest = cifar10_checkpoint.prepare_resume(train_dir)
    if latest:
      print('Resuming from %s.' % latest)
      resumed_step = cifar10_checkpoint.checkpoint_step(latest)
  cifar10_checkpoint.add_saver()
  _quiet_session_noise()
  signal_hook = cifar10_hooks.StopOnSignalHook()
  nan_hook = cifar10_hooks.NanLossHook(loss)
  all_hooks = list(hooks) + [
      nan_hook,
      tf1.train.StopAtStepHook(last_step=FLAGS.max_steps),
      signal_hook,
      cifar10_hooks.LoggerHook(loss, FLAGS.log_frequency, examples_per_step,
                               num_towers, log_prefix),
  ]
  if own_variables and not is_chief:
    all_hooks.append(cifar10_hooks.StopIfReachedHook())
  steps_run = 0
  try:
    with _training_session(master, is_chief, own_variables, scaffold,
                           all_hooks, config, resumed_step) as mon_sess:
      while not mon_sess.should_stop():
        mon_sess.run(train_op)
        steps_run += 1
  except cifar10_hooks.NanLossError as e:
    raise UsageError(
        'Model diverged with loss = %s at step %d. The last good checkpoint, '
        '%s, is kept. Lower --initial_learning_rate (now %g) and run again '
        'to resume from it.' % (e.value, e.step,
                                cifar10_checkpoint.rewind_to_finite(train_dir)
                                if is_chief else 'of the chief',
                                FLAGS.initial_learning_rate))
  except Exception as e:  # pylint: disable=broad-except
    failed = _failed_write(e, train_dir)
    if not failed:
      raise
    raise UsageError(
        'Failed to write %s: %s. Training stopped; the last good checkpoint, '
        '%s, is kept and the next run resumes from it. Make room for '
        '--train_dir=%s and run again.'
        % (failed + (tf1.train.latest_checkpoint(train_dir), train_dir)))
  finally:
    if lock:
      lock.close()
  if signal_hook.received is not None:
    print('Stopped by signal %d; checkpoint saved in %s.'
          % (signal_hook.received, tf1.train.latest_checkpoint(train_dir)))
  if step is None and not steps_run:
    reached_max_steps(nan_hook.step, log_prefix)  # Learned in the session.
  return steps_run


def _training_session(master, is_chief, own_variables, scaffold, hooks,
                      config, resumed_step):
  """Opens the training session (arguments as run_training's).

  TensorFlow's MonitoredSession, with what MonitoredTrainingSession gives
  a chief (the restore, checkpoints, summaries and global_step/sec, each
  every --save_summaries_steps) after
  the step's hooks, so that the NaN check stops a diverged step before
  the saver could save it. A worker with its own variables initializes
  them itself; its session, and the chief's then, treat a lost peer as
  final instead of retrying for ever.

  Args:
    resumed_step: the step of the checkpoint resumed from, or None.

  Returns:
    The tf.compat.v1.train.MonitoredSession.
  """
  train_dir = FLAGS.train_dir
  if is_chief:
    creator = tf1.train.ChiefSessionCreator(
        scaffold=scaffold, master=master, config=config,
        checkpoint_dir=train_dir)
    hooks = hooks + [
        cifar10_checkpoint.CheckpointSaverHook(
            resumed_step, train_dir, save_steps=FLAGS.save_checkpoint_steps,
            scaffold=scaffold),
        tf1.train.StepCounterHook(output_dir=train_dir,
                                  every_n_steps=FLAGS.save_summaries_steps),
        tf1.train.SummarySaverHook(save_steps=FLAGS.save_summaries_steps,
                                   output_dir=train_dir, scaffold=scaffold)]
  elif own_variables:
    creator = tf1.train.ChiefSessionCreator(scaffold=scaffold, master=master,
                                            config=config)
  else:
    creator = tf1.train.WorkerSessionCreator(
        scaffold=scaffold, master=master, config=config,
        max_wait_secs=WORKER_WAIT_SECS)
  if own_variables:
    creator = _FailFastSessionCreator(creator)
  return tf1.train.MonitoredSession(
      session_creator=creator, hooks=hooks,
      stop_grace_period_secs=STOP_GRACE_PERIOD_SECS)


def session_config():
  """The ConfigProto of every script's sessions.

  Soft placement; GPU memory taken as it is needed rather than all of it
  up front, so that a trainer, the evaluator and cifar10_predict.py share
  a GPU; device placement logged with --log_device_placement (trainers).
  """
  config = tf1.ConfigProto(
      allow_soft_placement=True,
      log_device_placement=('log_device_placement' in FLAGS and
                            FLAGS.log_device_placement))
  config.gpu_options.allow_growth = True
  return config


def _path_problem(path):
  """What keeps path from being a directory, as a phrase, or None.

  'scheme://' paths are left to TensorFlow.
  """
  if '://' in path:
    return None
  if os.path.exists(path):
    return None if os.path.isdir(path) else 'it is a file, not a directory'
  parent = os.path.dirname(os.path.abspath(path))
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    return '%s is a file, so no directory can be made under it' % parent
  if not os.access(parent, os.W_OK | os.X_OK):
    return 'it does not exist and %s is not writable' % parent
  return None


def check_path_flags():
  """Checks every directory flag of the script before any work starts.

  Raises:
    UsageError: a directory flag names a file, or a path no directory can
      be made at.
  """
  for name in PATH_FLAGS:
    if name in FLAGS and FLAGS[name].value is not None:
      problem = _path_problem(FLAGS[name].value)
      if problem:
        raise UsageError('--%s=%s: %s. Give a directory there.'
                         % (name, FLAGS[name].value, problem))


def _parse_flags(argv):
  """Parses the command line; a bad flag is one line and exit code 2.

  --help and its kin print the help and exit 0 (absl exits 1).
  """
  try:
    return FLAGS(argv)
  except flags.Error as e:
    sys.stderr.write('Error: %s. See --help.\n' % str(e).rstrip('.'))
    sys.exit(2)
  except SystemExit:
    if any(arg.lstrip('-').split('=')[0] in HELP_FLAGS
           for arg in argv[1:] if arg.startswith('-')):
      sys.exit(0)
    raise


def run_main(main, takes_arguments=False):
  """Parses flags and runs main(argv); user errors print one line, exit 1.

  Every directory flag is checked first (check_path_flags).

  Args:
    main: the script's main function, taking argv; what it returns is the
      exit status.
    takes_arguments: whether arguments other than flags are the script's.
  """
  def checked_main(argv):
    if len(argv) > 1 and not takes_arguments:
      raise UsageError('Unexpected arguments %s. See --help.'
                       % ' '.join(argv[1:]))
    if not FLAGS['verbosity'].present:
      # Step lines, not TensorFlow's INFO log, unless -v/--verbosity says so.
      tf1.logging.set_verbosity(tf1.logging.WARN)
    check_path_flags()
    return main(argv)
  try:
    app.run(checked_main, flags_parser=_parse_flags)
  except (UsageError, cifar10_input.DataError,
          cifar10_checkpoint.CheckpointError) as e:
    sys.stderr.write('Error: %s\n' % e)
    sys.exit(1)
  except KeyboardInterrupt:
    sys.stderr.write('Interrupted.\n')
    sys.exit(130)
