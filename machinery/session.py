"""Opens the trainers' session: the tutorial's, with what keeps a run safe.

A trainer defines its flags with define_trainer_flags and runs its steps
in training_session, as the tutorial ran them in MonitoredTrainingSession:

  define_trainer_flags()
  ...
  with training_session(loss, 128, recipe,
                        config=hardware.session_config()) as mon_sess:
    while not mon_sess.should_stop():
      mon_sess.run(train_op)

Like MonitoredTrainingSession over --train_dir, it restores the latest
checkpoint or initializes the model, and saves checkpoints and summaries.
Around it, one line each in the story's `with`, stands what keeps a run
safe: a lock keeps a second trainer out of --train_dir (lock.py); the
newest readable checkpoint is the one resumed from (checkpoints.py);
Ctrl-C or SIGTERM stops cleanly with a checkpoint; the steps --trace_steps
lists are traced; a NaN loss, a failed write into --train_dir or a lost
peer leaves it as one errors.Error. A process trains alone (LocalRole)
unless the distributed trainer gives it a worker's role in a cluster
(worker_session.WorkerRole).
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import contextlib
import functools
import math
import re

from machinery import checkpoints
from machinery import console
from machinery import errors
from machinery import step_hooks
from machinery import lock
from machinery import memory
from machinery import writes
import tensorflow as tf

tf1 = tf.compat.v1
flags = tf1.flags
FLAGS = flags.FLAGS

# Seconds the training session waits for its threads at the end.
STOP_GRACE_PERIOD_SECS = 5

# The name scope of the ops the session adds to the graph.
SESSION_SCOPE = 'session'

# --max_steps, unless the trainer says otherwise: the tutorial's 100K.
DEFAULT_MAX_STEPS = 100000


def define_trainer_flags():
  """Defines the flags every trainer takes. --max_steps defaults to the
  tutorial's 100000; a trainer of another default sets it as it starts
  (cli.run_main's defaults), so that no default depends on which trainer
  a process imported first."""
  if 'train_dir' in FLAGS:
    return  # Two trainers imported into one process (tests).
  flags.DEFINE_string('train_dir', '/tmp/cifar10_train',
                      'Directory where to write event logs and checkpoints. '
                      'It is never deleted: a rerun resumes from it.')
  flags.DEFINE_integer('max_steps', DEFAULT_MAX_STEPS,
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
  flags.DEFINE_integer('seed', None,
                       'Repeat a run: the same seed gives the same initial '
                       'weights, data order and distortions, and the same '
                       'checkpoints, on the same machine. None: random.')


def seed_graph(seed, offset=0):
  """Seeds the default graph with seed (--seed), so that the run repeats.

  The graph's seed fixes every random op built in it: the initial weights,
  the shuffle, the seed of each record's distortions (cifar10_input.py).
  The CPU's kernels then repeat their arithmetic exactly; a GPU's (cuDNN's
  convolutions, atomic additions) do so only with TensorFlow's
  deterministic kernels, which it turns on where there is a GPU. Call it
  before building the graph; with seed None it does nothing, and runs
  stay random.

  Args:
    seed: the seed, or None.
    offset: added to the seed: a distributed worker's index, so that
      each worker draws its own batches.
  """
  if seed is None:
    return
  tf1.set_random_seed(seed + offset)
  if tf.config.list_physical_devices('GPU'):
    tf.config.experimental.enable_op_determinism()


def examples_drawn(train_dir, seed, examples_per_step):
  """Returns the examples a run with a seed drew before the checkpoint of
  train_dir it resumes from (its step x examples_per_step), and says so:
  its input passes over them, so that the run goes on with the batches it
  would have drawn unstopped. 0 without a seed (each start draws afresh)
  or a checkpoint. Reads the directory; writes nothing.

  Raises:
    errors.CheckpointError: train_dir holds checkpoints, none readable.
  """
  if seed is None:
    return 0
  latest = checkpoints.latest_checkpoint(train_dir).path
  if latest is None:
    return 0
  step = checkpoints.step_of(latest)
  drawn = step * examples_per_step
  print('--seed %d: the input passes over the %s examples drawn before step '
        '%d, so that the run goes on as if unstopped.' %
        (seed, '{:,}'.format(drawn), step))
  return drawn


def last_step(examples_per_step, recipe):
  """Returns the global step training stops at: --max_steps, or the end of
  recipe's --train_epochs (at examples_per_step a step) where that
  comes first."""
  return recipe.last_step(FLAGS.max_steps, examples_per_step)


def ready_to_train(model, recipe, examples_per_step, towers):
  """Readies a trainer, before it builds anything: says so where training
  has reached its last step, checks that a step fits in memory
  (memory.check_step_fits), and gets the data.

  Args:
    model: the model's module, cifar10: its inference, loss and
      maybe_download_and_extract.
    recipe: the machinery.recipe.Recipe it trains with (its budget).
    examples_per_step: the examples of one step, over all towers.
    towers: the towers one step runs.

  Returns:
    Whether there is training to do.

  Raises:
    errors.OutOfMemoryError: a step would not fit in memory.
    errors.DataError: the data cannot be had.
  """
  if reached_max_steps(last_step(examples_per_step, recipe)):
    return False
  fit_and_fetch(model, towers)
  return True


def fit_and_fetch(model, towers):
  """Checks that a step of towers towers of --batch_size fits in memory
  (memory.check_step_fits), and gets the data into --data_dir.

  Raises:
    errors.OutOfMemoryError: a step would not fit in memory.
    errors.DataError: the data cannot be had.
  """
  memory.check_step_fits(model, FLAGS.batch_size, towers)
  model.maybe_download_and_extract(FLAGS.data_dir, FLAGS.data_url,
                                   FLAGS.data_md5)


def reached_max_steps(last, step=None, log_prefix=''):
  """Says so in one line when training has reached its last step.

  Args:
    last: the step training stops at (last_step()).
    step: the global step training would resume from; None: the step of
      the latest checkpoint in --train_dir.
    log_prefix: text to start the line with.

  Returns:
    Whether step is at or past last.
  """
  if step is None:
    step = checkpoints.checkpoint_step(
        checkpoints.latest_checkpoint(FLAGS.train_dir).path)
  if step < last:
    return False
  if last < FLAGS.max_steps:
    limit, flag = ('the end of --train_epochs=%g (step %d)'
                   % (FLAGS.train_epochs, last), 'higher --train_epochs')
  else:
    limit, flag = '--max_steps is %d' % last, 'higher --max_steps'
  print('%sTraining in %s has reached step %d, %s: nothing to do. To train '
        'on, run again with a %s.' % (log_prefix, FLAGS.train_dir, step,
                                      limit, flag))
  return True


def _standard_hooks(loss, last, examples_per_step, num_towers, rate,
                    log_prefix):
  """Returns the tutorial's hooks around every step: stop at the last step,
  stop on a NaN loss (naming rate, --initial_learning_rate), print the
  step line."""
  return [tf1.train.StopAtStepHook(last_step=last),
          step_hooks.NanLossHook(loss, rate),
          step_hooks.LoggerHook(loss, FLAGS.log_frequency,
                                examples_per_step=examples_per_step,
                                num_towers=num_towers, prefix=log_prefix)]


class LocalRole(object):
  """Trains in a process alone: the chief of no cluster.

  training_session asks its role how to create the session; the
  distributed trainer's workers have a role of their own
  (worker_session.WorkerRole), which can also lose its peers.
  """

  # Whether this process restores the model, and writes checkpoints and
  # summaries to --train_dir.
  is_chief = True

  # The errors that mean a peer is gone (and peer_gone_error() says which):
  # none, alone.
  lost_peer_errors = ()

  def session_creator(self, scaffold, config):
    """Creates the session: restored from --train_dir, or initialized."""
    return tf1.train.ChiefSessionCreator(
        scaffold=scaffold, config=config, checkpoint_dir=FLAGS.train_dir)


@contextlib.contextmanager
def training_session(loss, examples_per_step, recipe, num_towers=1,
                     last=None, hooks=(), config=None, scaffold=None,
                     role=None, log_prefix=''):
  """Opens the MonitoredSession a trainer runs its steps in.

  Around every step it runs the tutorial's hooks: stop at the last step,
  stop on a NaN loss, print the step line every --log_frequency steps.

  Args:
    loss: the loss tensor the step line reports and the NaN check reads.
    examples_per_step: the examples this process trains on per step, for
      the step line's examples/sec and, unless last is given, the end of
      --train_epochs.
    recipe: the machinery.recipe.Recipe the step trains with: its
      budget, and its rate, which a NaN loss names.
    num_towers: the towers they are split over, for its sec/batch.
    last: the global step to stop at; None: last_step(examples_per_step,
      recipe).
    hooks: more SessionRunHooks, run first.
    config: a tf.compat.v1.ConfigProto, or None.
    scaffold: a tf.compat.v1.train.Scaffold (its summary and init ops).
    role: how this process takes part; None: alone (LocalRole).
    log_prefix: text to start each line with.

  Yields:
    The tf.compat.v1.train.MonitoredSession.

  Raises:
    errors.DivergedError: the loss became NaN (step_hooks.NanLossHook).
    errors.WriteError: a write into --train_dir failed.
    errors.OutOfMemoryError: a step ran out of a device's memory.
    errors.LockError: another trainer holds --train_dir.
    errors.PeerGoneError: a distributed worker lost a peer.
  """
  if last is None:
    last = last_step(examples_per_step, recipe)
  hooks = list(hooks) + _standard_hooks(
      loss, last, examples_per_step, num_towers,
      recipe.initial_learning_rate, log_prefix)
  role = role or LocalRole()
  scaffold = scaffold or tf1.train.Scaffold()
  config = _with_device_placement(config)
  held = lock.hold(FLAGS.train_dir) if role.is_chief else None
  try:
    resumed_step = _prepare_resume() if role.is_chief else None
    _quiet_session_noise()
    signal_hook = step_hooks.StopOnSignalHook()
    with _as_one_error(role):
      # What the session adds to the graph (the saver, the ops that
      # initialize and check the variables) under a name of its own, so
      # that TensorBoard's graph shows the model and the towers first.
      with tf1.name_scope(SESSION_SCOPE):
        checkpoints.add_saver()
        mon_sess = tf1.train.MonitoredSession(
            session_creator=role.session_creator(scaffold, config),
            hooks=hooks + [signal_hook] + _chief_hooks(
                role, resumed_step, scaffold, log_prefix),
            stop_grace_period_secs=STOP_GRACE_PERIOD_SECS)
      with mon_sess, _step_errors():
        yield mon_sess
  finally:
    if held:
      held.close()
  if signal_hook.received is not None:
    print('Stopped by signal %d; checkpoint saved in %s.'
          % (signal_hook.received, tf1.train.latest_checkpoint(
              FLAGS.train_dir)))


def train_until_done(train_op, loss, examples_per_step, recipe, **kwargs):
  """Runs train_op in a training_session until it stops (the trainers whose
  story is elsewhere: model parallelism, a distributed worker).

  Args:
    train_op: the op of one step.
    loss, examples_per_step, recipe, **kwargs: training_session's
      arguments.

  Returns:
    How many steps this process ran.
  """
  steps = 0
  with training_session(loss, examples_per_step, recipe,
                        **kwargs) as mon_sess:
    while not mon_sess.should_stop():
      mon_sess.run(train_op)
      steps += 1
  return steps


def _with_device_placement(config):
  """Returns a copy of config (or a new ConfigProto) that logs where each
  op is placed as --log_device_placement says."""
  logged = tf1.ConfigProto()
  if config is not None:
    logged.CopyFrom(config)
  logged.log_device_placement = FLAGS.log_device_placement
  return logged


def _prepare_resume():
  """Readies the newest readable checkpoint of --train_dir to resume from,
  and says which it is.

  Returns:
    Its global step, or None when there is none.

  Raises:
    errors.CheckpointError: no checkpoint there is readable, or it is
      another model's.
  """
  # What is on disk and readable, with the index file saying so.
  latest = checkpoints.prepare_resume(FLAGS.train_dir, {
      v.op.name: v for v in tf1.global_variables()})
  if not latest:
    return None
  print('Resuming from %s.' % latest)
  return checkpoints.checkpoint_step(latest)


@functools.lru_cache(maxsize=None)
def _quiet_session_noise():
  """Keeps two messages of TensorFlow's training session off the console:
  the event writer thread's report of a failed write, which the session
  makes one line, and the deprecation notice of get_checkpoint_mtimes,
  which the session's restore calls on every resume."""
  console.quiet_event_writer_errors()
  console.drop_tf_messages('get_checkpoint_mtimes')


def _chief_hooks(role, resumed_step, scaffold, log_prefix):
  """Makes what MonitoredTrainingSession gives a chief (checkpoints,
  summaries and global_step/sec in --train_dir), and the traces of
  --trace_steps.

  Args:
    role: the process's role; a process that is not the chief gets none.
    resumed_step: the step of the checkpoint resumed from, or None; it is
      not saved again.
    scaffold: the session's scaffold (its summary op and saver).
    log_prefix: text to start each line with.

  Returns:
    A list of SessionRunHooks.
  """
  if not role.is_chief:
    return []
  train_dir = FLAGS.train_dir
  chief_hooks = [
      checkpoints.CheckpointSaverHook(
          resumed_step, train_dir, save_steps=FLAGS.save_checkpoint_steps,
          scaffold=scaffold),
      tf1.train.StepCounterHook(output_dir=train_dir,
                                every_n_steps=FLAGS.save_summaries_steps),
      tf1.train.SummarySaverHook(save_steps=FLAGS.save_summaries_steps,
                                 output_dir=train_dir, scaffold=scaffold)]
  if FLAGS.trace_steps:
    chief_hooks.append(step_hooks.TraceHook(
        [int(step) for step in FLAGS.trace_steps], train_dir, log_prefix))
  return chief_hooks


@contextlib.contextmanager
def _step_errors():
  """Lets a step's failed write leave the session as one WriteError, and a
  step that ran out of memory as one OutOfMemoryError.

  MonitoredSession takes an OutOfRangeError for the end of the input and
  ends the session as if training were done. The training input repeats
  for ever, so an OutOfRangeError here is something else: TensorFlow
  reports a file over a size limit (EFBIG) as one. It must leave the
  session as another error, or training would stop without a word; so
  this block stands inside the session.
  """
  try:
    with _as_write_error():
      yield
  except tf.errors.ResourceExhaustedError as e:
    error = out_of_memory_error(e)
    if error:
      raise error
    raise
  except tf.errors.OutOfRangeError as e:
    raise RuntimeError('Training stopped on an OutOfRangeError, which its '
                       'input, repeated for ever, never raises: %s' % e)


@contextlib.contextmanager
def _as_one_error(role):
  """Turns what stops the session into one errors.Error: a NaN loss, a
  write into --train_dir that fails as the session starts or ends (the
  first or last checkpoint), a peer the role has lost."""
  try:
    with _as_write_error():
      yield
  except step_hooks.NanLossError as e:
    raise _diverged(e, role.is_chief)
  except role.lost_peer_errors:
    raise role.peer_gone_error()


def _diverged(error, is_chief):
  """Makes the DivergedError of a NaN loss (a step_hooks.NanLossError): it
  names --initial_learning_rate and, where scaling or a warm-up made the
  step's rate another, that rate."""
  rate = '%g' % error.learning_rate
  if error.step_rate is not None and not math.isclose(
      error.step_rate, error.learning_rate, rel_tol=1e-4):
    rate += '; the rate at step %d was %g' % (error.step, error.step_rate)
  return errors.DivergedError(
      'Model diverged with loss = %s at step %d. The last good checkpoint, '
      '%s, is kept. Lower --initial_learning_rate (now %s) and run again to '
      'resume from it.' % (error.value, error.step,
                           checkpoints.rewind_to_finite(FLAGS.train_dir)
                           if is_chief else 'of the chief', rate))


def out_of_memory_error(error):
  """Makes the OutOfMemoryError of a step that ran out of memory on a
  device (TensorFlow's ResourceExhaustedError 'OOM when allocating', as a
  GPU's allocator raises it), or returns None for any other error: a full
  disk, also a ResourceExhaustedError, names a file instead."""
  match = re.search(r'OOM when allocating tensor with shape\[([^\]]*)\].*? on '
                    r'(?:/job:\w+/replica:\d+/task:\d+/)?(?:device:)?(\S+) ',
                    str(error))
  if not isinstance(error, tf.errors.ResourceExhaustedError) or not match:
    return None
  shared = 'num_gpus' in FLAGS and FLAGS.num_gpus > 1
  return errors.OutOfMemoryError(
      'Out of memory on %s in a training step (allocating a tensor of shape '
      '[%s]) with --batch_size=%d%s. Lower --batch_size%s and run again: it '
      'resumes from the last checkpoint, %s.' % (
          match.group(2), match.group(1), FLAGS.batch_size,
          ' a tower' if shared else '',
          ' (or --num_gpus, where towers share a GPU with --virtual_gpus)'
          if shared else '', tf1.train.latest_checkpoint(FLAGS.train_dir)))


def _as_write_error():
  """Returns the block in which a failed write into --train_dir becomes one
  errors.WriteError (writes.as_write_error)."""
  return writes.as_write_error(
      'train_dir', FLAGS.train_dir, then=lambda: (
          'Training stopped; the last good checkpoint, %s, is kept and the '
          'next run resumes from it.' % tf1.train.latest_checkpoint(
              FLAGS.train_dir)))
