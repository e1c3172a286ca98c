"""Evaluation for CIFAR-10: precision @ 1 of the moving-average weights.

Reads the latest readable checkpoint of --checkpoint_dir, restores the
moving averages of the trained variables into the model, counts correct
top-1 predictions over exactly --num_examples images of --eval_data,
prints the precision and writes it as 'Precision @ 1' to --eval_dir.
With --raw_weights it restores the trained variables themselves instead
(the summary is then 'Precision @ 1 (raw weights)'), which shows what the
moving averages add.

Usage:
  python cifar10_eval.py --checkpoint_dir=/tmp/cifar10_train --run_once

Without --run_once it evaluates each new checkpoint, checking every
--eval_interval_secs seconds, until stopped with Ctrl-C.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import datetime
import math
import time

import cifar10
from machinery import checkpoints
from machinery import cli
from machinery import console
from machinery import errors
from machinery import hardware
from machinery import lock
from machinery import options
from machinery import summaries
from machinery import writes
import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
flags = tf1.flags
FLAGS = flags.FLAGS

flags.DEFINE_string('eval_dir', '/tmp/cifar10_eval',
                    'Directory where to write event logs.')
flags.DEFINE_enum('eval_data', 'test', ['test', 'train_eval', 'held_out'],
                  'test, train_eval (the training images), or held_out: '
                  'the last 5,000 training images, which a trainer\'s '
                  '--hold_out leaves out of training.')
checkpoints.define_checkpoint_dir_flag()
flags.declare_key_flag('checkpoint_dir')
flags.DEFINE_integer('eval_interval_secs', 60 * 5,
                     'How often to run the eval.', lower_bound=1)
flags.DEFINE_integer('num_examples', 10000,
                     'Number of examples to run.', lower_bound=1)
flags.DEFINE_boolean('run_once', False,
                     'Whether to run eval only once.')
flags.DEFINE_boolean('raw_weights', False,
                     'Evaluate the trained variables themselves instead of '
                     'their moving averages.')
flags.adopt_module_key_flags(cifar10)



def eval_once(saver, summary_writer, top_k_op, summary_op, checkpoint_path,
              variables):
  """Evaluates one checkpoint: restores it, counts, prints, summarizes.

  Args:
    saver: Saver.
    summary_writer: Summary writer.
    top_k_op: Top K op.
    summary_op: Summary op.
    checkpoint_path: the checkpoint to evaluate.
    variables: what saver restores, {name in the checkpoint: variable}.

  Returns:
    The precision @ 1, or None when the checkpoint went while being read.

  Raises:
    errors.CheckpointError: it went, with --run_once, or it is not this
      model's.
    errors.WriteError: the precision could not be written to --eval_dir.
  """
  with tf1.Session(config=hardware.session_config()) as sess:
    try:
      # The checkpoint's step, and its weights into the model.
      global_step = checkpoints.check_checkpoint(checkpoint_path, variables)
      saver.restore(sess, checkpoint_path)
    except (tf.errors.NotFoundError, tf.errors.DataLossError) as e:
      # The trainer's saver deletes old checkpoints, maybe this one.
      _checkpoint_gone(checkpoint_path, e)
      return None

    # Count exactly num_examples: the last batch may run past them.
    num_iter = int(math.ceil(FLAGS.num_examples / FLAGS.batch_size))
    true_count = 0  # Correct predictions so far.
    remaining = FLAGS.num_examples
    for _ in range(num_iter):
      predictions = sess.run(top_k_op)
      true_count += int(np.sum(predictions[:remaining]))
      remaining -= FLAGS.batch_size

    # The fraction of them that the model got right.
    precision = true_count / FLAGS.num_examples
    print('%s: precision @ 1 = %.3f%s' % (
        datetime.datetime.now(), precision,
        ' (raw weights)' if FLAGS.raw_weights else ''))
    summary = sess.run(summary_op)
  _record(summary_writer, summary, precision, checkpoint_path, global_step)
  return precision


def _checkpoint_gone(checkpoint_path, error):
  """Says that a checkpoint went while being read; the evaluator tries
  again later.

  Raises:
    errors.CheckpointError: with --run_once, as there is no later.
  """
  if FLAGS.run_once:
    raise errors.CheckpointError('Cannot read checkpoint %s: %s'
                                 % (checkpoint_path, errors.tf_reason(error)))
  print('%s: Checkpoint %s is gone or incomplete; trying again in %d s.'
        % (datetime.datetime.now(), checkpoint_path, FLAGS.eval_interval_secs))


def _record(summary_writer, summary, precision, checkpoint_path, step):
  """Writes the model's summaries and the precision to --eval_dir.

  The precision goes last, in a small event of its own: TensorFlow's event
  writer drops a large record that fails to be written (the images) without
  a word, and reports a failed write when it flushes what it holds back.

  Raises:
    errors.WriteError: a write into --eval_dir failed.
  """
  tag = summaries.PRECISION_TAG + (
      ' (raw weights)' if FLAGS.raw_weights else '')
  with writes.as_write_error(
      'eval_dir', FLAGS.eval_dir, then='The precision of %s is printed above '
      'but not recorded; the next evaluation records it.' % checkpoint_path):
    summary_writer.add_summary(summary, step)
    summary_writer.add_summary(tf1.Summary(value=[
        tf1.Summary.Value(tag=tag, simple_value=precision)]), step)
    summary_writer.flush()


def weights_to_restore(raw_weights):
  """Maps the names in a checkpoint to the model's variables to restore.

  Args:
    raw_weights: the trained variables themselves; False: their moving
      averages (the tutorial's evaluation).

  Returns:
    {name in the checkpoint: variable of the model}, for a Saver.
  """
  if raw_weights:
    return {v.op.name: v for v in tf1.global_variables()}
  # The trainer kept a moving average of every trained variable, which
  # restore into the model's variables.
  return cifar10.averaged_weights()


def correct_predictions(eval_data, data_dir=cifar10.DATA_DIR,
                        batch_size=cifar10.BATCH_SIZE, opts=options.DEFAULT,
                        held_out=False):
  """Builds the eval inputs, the model and the top-1 check per image.

  Args:
    eval_data: bool, True for the test set, False for the training set.
    data_dir: where the CIFAR-10 data is.
    batch_size: the images of each batch.
    opts: the options for speed, a machinery.options.Options.
    held_out: of the training set, only the 5,000 images --hold_out leaves
      out.

  Returns:
    A bool [batch_size] tensor, True where the prediction is right.
  """
  # Central crops of the evaluation images, in file order, and labels.
  images, labels = cifar10.inputs(eval_data, data_dir, batch_size, opts,
                                  held_out)

  # The model's logits for them.
  logits = cifar10.inference(images, opts)

  # Whether the top class is the label (in float32, which in_top_k needs).
  return tf1.nn.in_top_k(tf.cast(logits, tf.float32), labels, 1)


def evaluate():
  """Evaluates the latest checkpoint, once or each new one as it comes."""
  eval_data = FLAGS.eval_data == 'test'
  held_out = FLAGS.eval_data == 'held_out'
  _check_num_examples()
  with tf.Graph().as_default() as g:
    # The model on the evaluation batches, and its correct predictions.
    top_k_op = correct_predictions(eval_data, FLAGS.data_dir,
                                   FLAGS.batch_size, options.from_flags(),
                                   held_out)

    # The model's variables take the moving averages of the trained ones
    # (or, with --raw_weights, the trained values themselves).
    variables_to_restore = weights_to_restore(FLAGS.raw_weights)
    saver = tf1.train.Saver(variables_to_restore)

    # The model's summaries (the images, the activations), written with
    # each precision.
    summary_op = tf1.summary.merge_all()

    # One evaluator per --eval_dir: a second would write an event file of
    # the same name over this one's.
    held = lock.hold(FLAGS.eval_dir, lock.EVALUATOR)
    try:
      summary_writer = tf1.summary.FileWriter(FLAGS.eval_dir, g)
      console.quiet_event_writer_errors()  # _record says it in one line.
      _evaluate_each(saver, summary_writer, top_k_op, summary_op,
                     variables_to_restore)
    finally:
      if held:
        held.close()


def _check_num_examples():
  """Counts the held-out images, all 5,000 of them, unless --num_examples
  says fewer; raises errors.UsageError for more than --eval_data has."""
  available = {'test': cifar10.NUM_EXAMPLES_PER_EPOCH_FOR_EVAL,
               'train_eval': cifar10.NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN,
               'held_out': cifar10.NUM_EXAMPLES_HELD_OUT}[FLAGS.eval_data]
  if FLAGS.eval_data == 'held_out' and not FLAGS['num_examples'].present:
    FLAGS.num_examples = min(FLAGS.num_examples, available)
  if FLAGS.num_examples > available:
    raise errors.UsageError(
        '--num_examples=%d is more than the %d examples of --eval_data=%s.'
        % (FLAGS.num_examples, available, FLAGS.eval_data))


def _evaluate_each(saver, summary_writer, top_k_op, summary_op, variables):
  """Evaluates the latest checkpoint once (--run_once), or each new one as
  it comes, checking every --eval_interval_secs."""
  last_evaluated = None
  while True:
    checkpoint_path = _latest_checkpoint()
    if checkpoint_path and checkpoint_path != last_evaluated:
      if eval_once(saver, summary_writer, top_k_op, summary_op,
                   checkpoint_path, variables) is not None:
        last_evaluated = checkpoint_path
    if FLAGS.run_once:
      break
    time.sleep(FLAGS.eval_interval_secs)


_said = set()


def _say_once(line):
  """Prints a line with the time, unless it was printed before."""
  if line not in _said:
    _said.add(line)
    print('%s: %s' % (datetime.datetime.now(), line))


def _latest_checkpoint():
  """Finds the newest readable checkpoint of --checkpoint_dir, or None.

  Says once which newer ones it passes over and why. Without a checkpoint
  to evaluate, --run_once raises an error; otherwise it says so and the
  evaluator waits, as the trainer may write one.

  Raises:
    errors.CheckpointError: --run_once, and no checkpoint, or none is
      readable.
  """
  try:
    latest = checkpoints.latest_checkpoint(FLAGS.checkpoint_dir)
  except errors.CheckpointError as e:
    if FLAGS.run_once:
      raise
    _say_once('%s Waiting for a readable one.' % e)
    return None
  if latest.path is None:
    if FLAGS.run_once:
      raise errors.CheckpointError('No checkpoint file found in %s.'
                                   % FLAGS.checkpoint_dir)
    print('%s: No checkpoint file found in %s; waiting.'
          % (datetime.datetime.now(), FLAGS.checkpoint_dir))
  for line in checkpoints.notes(latest, 'Evaluating %s.' % latest.path):
    _say_once(line)
  return latest.path


def main(argv=None):  # pylint: disable=unused-argument
  cifar10.maybe_download_and_extract(FLAGS.data_dir, FLAGS.data_url,
                                     FLAGS.data_md5)
  evaluate()


if __name__ == '__main__':
  cli.run_main(main)
