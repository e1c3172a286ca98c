"""The training session the trainers share: the tutorial's training loop.

The trainers define their flags with define_trainer_flags and train with
run_training, a MonitoredSession over --train_dir with the tutorial's
hooks (cifar10_hooks.py):

  define_trainer_flags(max_steps=100000)

  def main(argv):
    train_op, loss = ...  # built with cifar10.py
    run_training(train_op, loss, examples_per_step=FLAGS.batch_size,
                 config=cifar10_devices.session_config())

  if __name__ == '__main__':
    cifar10_cli.run_main(main)

It resumes from the latest readable checkpoint, stops at --max_steps, logs
every --log_frequency steps, writes summaries and checkpoints, traces the
steps --trace_steps lists, saves a checkpoint on Ctrl-C or SIGTERM, holds a
lock on --train_dir, and turns a diverged loss or a failed write into one
line. A process trains alone
(LocalRole) unless the distributed trainer gives it a worker's role in a
cluster (cifar10_distributed_session.WorkerRole).
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

import cifar10  # First: it quiets TensorFlow's start-up logging.
import cifar10_checkpoint
import cifar10_cli
import cifar10_hooks
import tensorflow as tf

tf1 = tf.compat.v1
flags = tf1.flags
FLAGS = flags.FLAGS

# Seconds the training session waits for its threads at the end.
STOP_GRACE_PERIOD_SECS = 5

# The file in --train_dir that the training process holds a lock on.
LOCK_FILE = 'trainer.lock'


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
  flags.DEFINE_list('trace_steps', [],
                    'Global steps to trace, e.g. 100,1000: each one\'s '
                    'timeline goes to --train_dir as trace-step-N.json '
                    '(chrome://tracing), its run metadata to TensorBoard\'s '
                    'Graphs tab. Empty: none.')
  flags.register_validator(
      'trace_steps', lambda steps: all(s.isdigit() for s in steps),
      message='give global steps, numbers from 0, comma-separated')


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


class LocalRole(object):
  """A process that trains alone: the chief of no cluster.

  run_training asks its role where training resumes and how to create the
  session; the distributed trainer's workers have a role of their own
  (cifar10_distributed_session.WorkerRole).
  """

  # Whether this process restores the model, and writes checkpoints and
  # summaries to --train_dir.
  is_chief = True

  def resume_step(self, config, scaffold):
    """The global step training resumes from; writes nothing."""
    del config, scaffold  # A session of its own needs neither yet.
    return cifar10_checkpoint.checkpoint_step(
        cifar10_checkpoint.latest_checkpoint(FLAGS.train_dir).path)

  def session_creator(self, scaffold, config):
    """Creates the session: restored from --train_dir, or initialized."""
    return tf1.train.ChiefSessionCreator(
        scaffold=scaffold, config=config, checkpoint_dir=FLAGS.train_dir)


def _lock_train_dir(train_dir):
  """Takes the lock that keeps a second trainer out of train_dir.

  An flock on train_dir/LOCK_FILE, which names its holder; the kernel
  releases it when the process ends, even by kill -9. Local paths only.

  Returns:
    The open lock file, to close when training ends, or None.

  Raises:
    cifar10_cli.UsageError: another live process holds the lock, or the
      lock file cannot be made or locked there.
  """
  if '://' in train_dir:
    return None
  path = os.path.join(train_dir, LOCK_FILE)
  try:
    os.makedirs(train_dir, exist_ok=True)
    lock = open(path, 'a+')
  except OSError as e:
    raise cifar10_cli.UsageError(
        'Cannot make the lock file %s: %s. Check that --train_dir=%s can be '
        'written to.' % (path, e.strerror or e, train_dir))
  try:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:  # Another process holds it.
    lock.seek(0)
    holder = lock.read().strip() or 'another process'
    lock.close()
    raise cifar10_cli.UsageError(
        '--train_dir=%s is in use by %s. Wait for it to end or stop it, or '
        'train in another --train_dir.' % (train_dir, holder))
  except OSError as e:  # This filesystem takes no locks.
    lock.close()
    raise cifar10_cli.UsageError(
        'Cannot lock %s: %s. Give a --train_dir on a local filesystem.'
        % (path, e.strerror or e))
  lock.truncate(0)
  lock.write('process %d on %s (%s)\n' % (os.getpid(), socket.gethostname(),
                                          ' '.join(sys.argv)))
  lock.flush()
  return lock


def _failed_write(error, train_dir):
  """Reads a failed write into train_dir out of the error training stopped
  with (cifar10_cli.failed_write), and removes what it left half-written.

  Returns:
    (what, reason): what failed to be written, and why; or None if error
    is not a failed write into train_dir.
  """
  failed = cifar10_cli.failed_write(error, train_dir)
  if not failed:
    return None
  path, reason = failed
  checkpoint = re.match(r'.*model\.ckpt-\d+', path)
  if checkpoint:
    temporary = checkpoint.group(0) + '_temp'  # The saver writes here first.
    if tf.io.gfile.isdir(temporary):
      tf.io.gfile.rmtree(temporary)
    return 'the checkpoint ' + checkpoint.group(0), reason
  if '.tmp' in os.path.basename(path) and tf.io.gfile.exists(path):
    tf.io.gfile.remove(path)
  if '.tfevents.' in path:
    cifar10_cli.drop_half_written_record(path)
    return 'the event file ' + path, reason
  return path, reason


@functools.lru_cache(maxsize=None)
def _quiet_session_noise():
  """Keeps two messages of TensorFlow's training session off the console:
  the event writer thread's report of a failed write, which run_training
  makes one line, and the deprecation notice of get_checkpoint_mtimes,
  which the session's restore calls on every resume."""
  cifar10_cli.quiet_event_writer_errors()
  cifar10_cli.drop_tf_messages('get_checkpoint_mtimes')


def _chief_hooks(role, resumed_step, scaffold, log_prefix):
  """What MonitoredTrainingSession gives a chief (checkpoints, summaries
  and global_step/sec in --train_dir), and the traces of --trace_steps.

  Args:
    role: the process's role; a process that is not the chief gets none.
    resumed_step: the step of the checkpoint resumed from, or None; it is
      not saved again.
    scaffold: the session's scaffold (its summary op and saver).
    log_prefix: text to start each line with.
  """
  if not role.is_chief:
    return []
  train_dir = FLAGS.train_dir
  hooks = [
      cifar10_checkpoint.CheckpointSaverHook(
          resumed_step, train_dir, save_steps=FLAGS.save_checkpoint_steps,
          scaffold=scaffold),
      tf1.train.StepCounterHook(output_dir=train_dir,
                                every_n_steps=FLAGS.save_summaries_steps),
      tf1.train.SummarySaverHook(save_steps=FLAGS.save_summaries_steps,
                                 output_dir=train_dir, scaffold=scaffold)]
  if FLAGS.trace_steps:
    hooks.append(cifar10_hooks.TraceHook(
        [int(step) for step in FLAGS.trace_steps], train_dir, log_prefix))
  return hooks


def _prepare_resume():
  """Readies the newest readable checkpoint of --train_dir to resume from,
  and says which it is.

  Returns:
    Its global step, or None when there is none.

  Raises:
    cifar10_checkpoint.CheckpointError: no checkpoint there is readable.
  """
  # What is on disk and readable, with the index file saying so.
  latest = cifar10_checkpoint.prepare_resume(FLAGS.train_dir)
  if not latest:
    return None
  print('Resuming from %s.' % latest)
  return cifar10_checkpoint.checkpoint_step(latest)


def _diverged(error, is_chief):
  """The UsageError for a NaN loss (a cifar10_hooks.NanLossError)."""
  return cifar10_cli.UsageError(
      'Model diverged with loss = %s at step %d. The last good checkpoint, '
      '%s, is kept. Lower --initial_learning_rate (now %g) and run again to '
      'resume from it.' % (error.value, error.step,
                           cifar10_checkpoint.rewind_to_finite(FLAGS.train_dir)
                           if is_chief else 'of the chief',
                           FLAGS.initial_learning_rate))


def _write_error(error):
  """The UsageError for an error that is a failed write into --train_dir
  (_failed_write), or None for any other error."""
  failed = _failed_write(error, FLAGS.train_dir)
  if not failed:
    return None
  what, reason = failed
  return cifar10_cli.UsageError(
      'Failed to write %s: %s. Training stopped; the last good checkpoint, '
      '%s, is kept and the next run resumes from it. %s'
      % (what, reason, tf1.train.latest_checkpoint(FLAGS.train_dir),
         cifar10_cli.write_advice(reason, 'train_dir', FLAGS.train_dir)))


def _run_step(mon_sess, train_op):
  """Runs one training step; a write into --train_dir that fails there (a
  checkpoint, a summary) is a UsageError.

  MonitoredSession takes an OutOfRangeError for the end of the input and
  ends the session as if training were done. The training input repeats
  for ever, so an OutOfRangeError here is something else: TensorFlow
  reports a file over a size limit (EFBIG) as one. It must leave the
  session as another error, or training would stop without a word.
  """
  try:
    mon_sess.run(train_op)
  except cifar10_cli.WRITE_ERRORS as e:
    error = _write_error(e)
    if error:
      raise error
    if isinstance(e, tf.errors.OutOfRangeError):
      raise RuntimeError('Training stopped on an OutOfRangeError, which its '
                         'input, repeated for ever, never raises: %s' % e)
    raise


def run_training(train_op, loss, examples_per_step, num_towers=1,
                 config=None, scaffold=None, hooks=(), log_prefix='',
                 role=None):
  """Runs train_op in a MonitoredSession over --train_dir until --max_steps.

  Args:
    train_op: the op for one step.
    loss: the loss tensor to log and check for NaN.
    examples_per_step: examples one step consumes over all towers.
    num_towers: towers per step, for the sec/batch figure.
    config: a tf.compat.v1.ConfigProto, or None.
    scaffold: a tf.compat.v1.train.Scaffold (its summary and init ops).
    hooks: more SessionRunHooks.
    log_prefix: text to start each line with.
    role: how this process takes part; None: alone (LocalRole).

  Returns:
    The number of steps this process ran.

  Raises:
    cifar10_cli.UsageError: the loss became NaN, a write into --train_dir
      failed, or another trainer holds --train_dir.
  """
  role = role or LocalRole()
  scaffold = scaffold or tf1.train.Scaffold()
  step = role.resume_step(config, scaffold)
  if step is not None and reached_max_steps(step, log_prefix):
    return 0
  lock = _lock_train_dir(FLAGS.train_dir) if role.is_chief else None
  resumed_step = _prepare_resume() if role.is_chief else None
  cifar10_checkpoint.add_saver()
  _quiet_session_noise()
  signal_hook = cifar10_hooks.StopOnSignalHook()
  nan_hook = cifar10_hooks.NanLossHook(loss)
  # The NaN check comes before the chief's saver, so that a diverged step
  # stops before it could be saved.
  all_hooks = list(hooks) + [
      nan_hook,
      tf1.train.StopAtStepHook(last_step=FLAGS.max_steps),
      signal_hook,
      cifar10_hooks.LoggerHook(loss, FLAGS.log_frequency, examples_per_step,
                               num_towers, log_prefix),
  ] + _chief_hooks(role, resumed_step, scaffold, log_prefix)
  steps_run = 0
  try:
    with tf1.train.MonitoredSession(
        session_creator=role.session_creator(scaffold, config),
        hooks=all_hooks,
        stop_grace_period_secs=STOP_GRACE_PERIOD_SECS) as mon_sess:
      while not mon_sess.should_stop():
        _run_step(mon_sess, train_op)
        steps_run += 1
  except cifar10_hooks.NanLossError as e:
    raise _diverged(e, role.is_chief)
  except cifar10_cli.WRITE_ERRORS as e:
    # A write as the session starts or ends: the first or last checkpoint.
    error = _write_error(e)
    if not error:
      raise
    raise error
  finally:
    if lock:
      lock.close()
  if signal_hook.received is not None:
    print('Stopped by signal %d; checkpoint saved in %s.'
          % (signal_hook.received, tf1.train.latest_checkpoint(
              FLAGS.train_dir)))
  if step is None and not steps_run:
    reached_max_steps(nan_hook.step, log_prefix)  # Learned in the session.
  return steps_run
