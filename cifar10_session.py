"""The training session and the command line that the scripts share.

Every script runs through run_main, which parses its flags, checks its
directory flags and reports a user's mistake as one `Error:` line. The
trainers define their flags with define_trainer_flags and train with
run_training, a MonitoredTrainingSession over --train_dir with the
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

import datetime
import fcntl
import functools
import math
import os
import re
import signal
import socket
import sys
import threading
import time

import cifar10  # First: it quiets TensorFlow's start-up logging.
import cifar10_input
from absl import app  # pylint: disable=g-bad-import-order
import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
flags = tf1.flags
FLAGS = flags.FLAGS

# Seconds the training session waits for its threads at the end.
STOP_GRACE_PERIOD_SECS = 5

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


class NanLossError(Exception):
  """The loss became NaN or infinite."""

  def __init__(self, step, value):
    super(NanLossError, self).__init__('step %d, loss = %s' % (step, value))
    self.step = step
    self.value = value


class _StepCounter(tf1.train.SessionRunHook):
  """Base hook that knows the global step of the run in progress."""

  def __init__(self):
    self.step = 0

  def after_create_session(self, session, coord):
    self.step = session.run(tf1.train.get_global_step())

  def after_run(self, run_context, run_values):
    self.step += 1


class NanLossHook(_StepCounter):
  """Stops training with NanLossError when the loss is not finite."""

  def __init__(self, loss):
    super(NanLossHook, self).__init__()
    self._loss = loss

  def before_run(self, run_context):
    return tf1.train.SessionRunArgs(self._loss)

  def after_run(self, run_context, run_values):
    if not math.isfinite(run_values.results):
      raise NanLossError(self.step, run_values.results)
    super(NanLossHook, self).after_run(run_context, run_values)


class LoggerHook(_StepCounter):
  """Prints the step, loss and speed every log_frequency steps."""

  def __init__(self, loss, log_frequency, examples_per_step, num_towers=1,
               prefix=''):
    super(LoggerHook, self).__init__()
    self._prefix = prefix
    self._loss = loss
    self._log_frequency = log_frequency
    self._examples_per_step = examples_per_step
    self._num_towers = num_towers
    self._start_time = None
    self._start_step = 0

  def after_create_session(self, session, coord):
    super(LoggerHook, self).after_create_session(session, coord)
    self._start_time = time.time()
    self._start_step = self.step

  def before_run(self, run_context):
    if self.step % self._log_frequency == 0:
      return tf1.train.SessionRunArgs(self._loss)
    return None

  def after_run(self, run_context, run_values):
    if self.step % self._log_frequency == 0:
      current_time = time.time()
      duration = ((current_time - self._start_time) /
                  (self.step + 1 - self._start_step))
      self._start_time = current_time
      self._start_step = self.step + 1
      examples_per_sec = self._examples_per_step / duration
      sec_per_batch = duration / self._num_towers
      format_str = ('%s%s: step %d, loss = %.2f (%.1f examples/sec; %.3f '
                    'sec/batch)')
      print(format_str % (self._prefix, datetime.datetime.now(), self.step,
                          run_values.results, examples_per_sec,
                          sec_per_batch))
      sys.stdout.flush()
    super(LoggerHook, self).after_run(run_context, run_values)


class StopOnSignalHook(tf1.train.SessionRunHook):
  """Turns SIGINT and SIGTERM into a clean stop after the current step.

  The session then ends normally, so the checkpoint saver writes a
  checkpoint at the step reached. A second signal interrupts at once.
  """

  SIGNALS = (signal.SIGINT, signal.SIGTERM)

  def __init__(self):
    self.received = None
    self._previous = {}

  def _handle(self, signum, frame):
    del frame
    if self.received is not None:
      raise KeyboardInterrupt
    self.received = signum

  def begin(self):
    if threading.current_thread() is not threading.main_thread():
      return  # Python takes signals in the main thread only.
    for signum in self.SIGNALS:
      self._previous[signum] = signal.signal(signum, self._handle)

  def after_run(self, run_context, run_values):
    if self.received is not None:
      run_context.request_stop()

  def end(self, session):
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)


def _rewind_to_finite_checkpoint(train_dir):
  """Makes the newest checkpoint whose values are all finite the latest.

  The step before a NaN loss may already have written non-finite weights,
  and a checkpoint may have been saved from them. Those checkpoints stay on
  disk but leave the checkpoint state, so a rerun resumes from good ones.

  Returns:
    The path of that checkpoint, or None if there is none.
  """
  state = tf1.train.get_checkpoint_state(train_dir)
  paths = list(state.all_model_checkpoint_paths) if state else []
  while paths:
    reader = tf.train.load_checkpoint(paths[-1])
    if all(np.all(np.isfinite(reader.get_tensor(name)))
           for name, dtype in reader.get_variable_to_dtype_map().items()
           if dtype.is_floating):
      tf1.train.update_checkpoint_state(train_dir, paths[-1],
                                        all_model_checkpoint_paths=paths)
      return paths[-1]
    paths.pop()
  return None


def checkpoint_step(checkpoint_path):
  """Returns the global step a checkpoint was saved at; 0 for None."""
  if checkpoint_path is None:
    return 0
  return int(tf.train.load_checkpoint(checkpoint_path).get_tensor(
      tf1.GraphKeys.GLOBAL_STEP))


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
    step = checkpoint_step(tf1.train.latest_checkpoint(FLAGS.train_dir))
  if step < FLAGS.max_steps:
    return False
  print('%sTraining in %s has reached step %d, --max_steps is %d: nothing '
        'to do. To train on, run again with a higher --max_steps.'
        % (log_prefix, FLAGS.train_dir, step, FLAGS.max_steps))
  return True


def _step_reached(master, is_chief, config):
  """Where training resumes, writing nothing.

  The chief reads the step from the latest checkpoint in --train_dir (and
  at --max_steps restores it into the cluster); another worker reads it
  from the variables the chief has set. Arguments as run_training's.

  Returns:
    (global step, the chief's latest checkpoint or None).
  """
  if not is_chief:
    with tf1.Session(master, config=config) as sess:
      return int(sess.run(tf1.train.get_global_step())), None
  latest = tf1.train.latest_checkpoint(FLAGS.train_dir)
  step = checkpoint_step(latest)
  if master and step >= FLAGS.max_steps:
    # Restore it into the cluster, so that the other workers learn it too.
    with tf1.Session(master, config=config) as sess:
      tf1.train.Saver().restore(sess, latest)
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
def _quiet_writer_thread_errors():
  """Leaves the event writer thread's failed writes to run_training to report.

  The thread logs the error and prints its traceback; the main thread gets
  the same error at its next write, and run_training makes it one line.
  """
  tf.get_logger().addFilter(
      lambda record: 'writer thread error' not in record.getMessage())
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
                 hooks=(), log_prefix=''):
  """Runs train_op in a MonitoredTrainingSession over --train_dir.

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
    hooks: more SessionRunHooks.
    log_prefix: text to start each step line with.

  Returns:
    The number of steps this process ran.

  Raises:
    UsageError: the loss became NaN, a write into --train_dir failed, or
      another trainer holds --train_dir.
  """
  train_dir = FLAGS.train_dir
  step, latest = _step_reached(master, is_chief, config)
  if reached_max_steps(step, log_prefix):
    return 0
  lock = _lock_train_dir(train_dir) if is_chief else None
  if step and is_chief:
    print('Resuming from %s.' % latest)
  _quiet_writer_thread_errors()
  signal_hook = StopOnSignalHook()
  all_hooks = list(hooks) + [
      NanLossHook(loss),
      tf1.train.StopAtStepHook(last_step=FLAGS.max_steps),
      signal_hook,
      LoggerHook(loss, FLAGS.log_frequency, examples_per_step, num_towers,
                 log_prefix),
  ]
  # After the NaN check, so a diverged step is never saved.
  chief_only_hooks = [tf1.train.CheckpointSaverHook(
      train_dir, save_steps=FLAGS.save_checkpoint_steps, scaffold=scaffold)]
  steps_run = 0
  try:
    with tf1.train.MonitoredTrainingSession(
        master=master,
        is_chief=is_chief,
        checkpoint_dir=train_dir,
        scaffold=scaffold,
        hooks=all_hooks,
        chief_only_hooks=chief_only_hooks,
        save_checkpoint_secs=None,
        save_checkpoint_steps=None,
        save_summaries_steps=FLAGS.save_summaries_steps,
        config=config,
        stop_grace_period_secs=STOP_GRACE_PERIOD_SECS) as mon_sess:
      while not mon_sess.should_stop():
        mon_sess.run(train_op)
        steps_run += 1
  except NanLossError as e:
    raise UsageError(
        'Model diverged with loss = %s at step %d. The last good checkpoint, '
        '%s, is kept. Lower --initial_learning_rate (now %g) and run again '
        'to resume from it.' % (e.value, e.step,
                                _rewind_to_finite_checkpoint(train_dir)
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
  return steps_run


def session_config():
  """The trainers' ConfigProto: soft placement, placement logging if asked."""
  return tf1.ConfigProto(allow_soft_placement=True,
                         log_device_placement=FLAGS.log_device_placement)


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
  except (UsageError, cifar10_input.DataError) as e:
    sys.stderr.write('Error: %s\n' % e)
    sys.exit(1)
  except KeyboardInterrupt:
    sys.stderr.write('Interrupted.\n')
    sys.exit(130)
