"""Turns a write that failed into one line, and leaves no half-written file.

A full disk (ResourceExhaustedError), a file-size limit such as
`ulimit -f` (OutOfRangeError: EFBIG), a read-only or vanished directory:
TensorFlow names the file and the system's reason. Only an error that
names a file in the directory is a failed write: a step out of memory is
also a ResourceExhaustedError, and names none (session.out_of_memory_error
says it). The trainer, the evaluator and cifar10_predict.py write inside

  with writes.as_write_error('eval_dir', FLAGS.eval_dir,
                             then='The precision ...'):
    summary_writer.flush()

which turns a failed write there into one errors.WriteError and lets any
other error pass: write_error() removes what the write left half-written
(a checkpoint's temporary directory, a .tmp file, the broken record at
the end of an event file) and names the flag's directory and what to do.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import contextlib
import os
import re

from machinery import console
from machinery import errors
import tensorflow as tf

tf1 = tf.compat.v1

# TensorFlow reports a failed file write as '<path>; <reason>', raised as
# one of its OpErrors (the saver), or as the Python exception its event
# writer turns the error into (IndexError for OUT_OF_RANGE, which a file
# over a size limit, EFBIG, is; RuntimeError for the others).
WRITE_ERRORS = (tf.errors.OpError, IndexError, RuntimeError)

# The bytes around each record of an event file (TFRecord): its length and
# the length's checksum before it, the data's checksum after it.
_RECORD_FRAMING_BYTES = 8 + 4 + 4


@contextlib.contextmanager
def as_write_error(flag_name, flag_value, then, written_in=None, what=None):
  """Turns a failed write into flag_value, in the block, into one
  errors.WriteError (write_error); any other error passes as it is.

  Args:
    flag_name, flag_value, written_in, what: write_error's.
    then: what the failure means for the user's run, a sentence, or a
      function that returns it when a write fails.
  """
  try:
    yield
  except WRITE_ERRORS as e:
    error = write_error(e, flag_name, flag_value,
                        then() if callable(then) else then, written_in, what)
    if error is None:
      raise
    raise error


def failed_write(error, directory):
  """Reads a failed write into directory out of a TensorFlow error.

  Args:
    error: one of WRITE_ERRORS.
    directory: where the script writes (--train_dir, --eval_dir, ...).

  Returns:
    (the file's path, the reason), or None if error is not a failed write
    into directory.
  """
  # The path starts with the directory and may hold spaces; '/' or '\\'
  # (Windows) after it.
  match = re.search(r'(%s[/\\][^;\n]*); ([^\n\[]+)'
                    % re.escape(directory.rstrip('/\\')), str(error))
  if not match:
    return None
  return match.group(1), match.group(2).strip()


def write_error(error, flag_name, flag_value, then, written_in=None,
                what=None):
  """Makes the one-line error of a write that failed, after cleaning up.

  Args:
    error: one of WRITE_ERRORS.
    flag_name: the flag that names where the script writes ('train_dir').
    flag_value: the directory it names.
    then: what the failure means for the user's run, a sentence.
    written_in: where the file was written; None: flag_value.
    what: what failed to be written; None: the file, as its path says.

  Returns:
    The errors.WriteError, or None if error is not a failed write there.
  """
  failed = failed_write(error, written_in or flag_value)
  if not failed:
    return None
  path, reason = failed
  written = _clean_up(path)
  return errors.WriteError('Failed to write %s: %s. %s %s' % (
      what or written, reason, then,
      write_advice(reason, flag_name, flag_value)))


def _clean_up(path):
  """Removes what a failed write of path left half-written.

  Returns:
    What failed to be written: 'the checkpoint <prefix>', 'the event file
    <path>', or the path.
  """
  checkpoint = re.match(r'.*model\.ckpt-\d+', path)
  if checkpoint:
    temporary = checkpoint.group(0) + '_temp'  # The saver writes here first.
    if tf.io.gfile.isdir(temporary):
      tf.io.gfile.rmtree(temporary)
    return 'the checkpoint ' + checkpoint.group(0)
  if '.tmp' in os.path.basename(path) and tf.io.gfile.exists(path):
    tf.io.gfile.remove(path)
  if '.tfevents.' in path:
    drop_half_written_record(path)
    return 'the event file ' + path
  return path


def drop_half_written_record(path):
  """Cuts an event file back to its last whole record, where a failed
  write left part of one after it; every whole record stays.

  Args:
    path: the event file.
  """
  if '://' in path or not os.path.exists(path):
    return  # Local files only.
  whole = 0
  try:
    with console.quiet_tf_logging():  # tf_record_iterator is deprecated.
      for record in tf1.io.tf_record_iterator(path):
        whole += len(record) + _RECORD_FRAMING_BYTES
  except tf.errors.DataLossError:
    pass  # The half-written record: the file ends in it.
  if whole < os.path.getsize(path):
    os.truncate(path, whole)


def write_advice(reason, flag_name, directory):
  """Says what to do about a write into directory that failed for reason.

  Args:
    reason: the system's reason, as failed_write reads it.
    flag_name: the flag that names directory ('train_dir').
    directory: its value.

  Returns:
    A sentence.
  """
  where = '--%s=%s' % (flag_name, directory)
  if 'too large' in reason.lower():
    return ('A file-size limit stopped it (ulimit -f, or a FAT32 volume\'s '
            '4 GB): lift it, or give %s on another filesystem, and run '
            'again.' % where)
  if 'space' in reason.lower() or 'quota' in reason.lower():
    return 'Make room for %s and run again.' % where
  return 'Check that %s can be written to, and run again.' % where
