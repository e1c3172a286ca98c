"""The command line every script shares: flags in, one clear line out.

Every script ends with

  if __name__ == '__main__':
    cifar10_cli.run_main(main)

which parses its flags (a bad one is one `Error:` line and exit status
2; --help prints them and exits 0), checks its directory flags before any
work starts, runs main, and turns an Error raised anywhere (a user's
mistake, missing data, no readable checkpoint) into one `Error:` line and
exit status 1, without a traceback. Where our line says what matters,
TensorFlow's own chatter is kept off the console: its warnings inside a
block (quiet_tf_logging), given messages (drop_tf_messages), the
tracebacks of threads that end as expected (quiet_thread_errors).
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import contextlib
import functools
import logging
import os
import re
import sys
import threading

from absl import app
import tensorflow as tf

tf1 = tf.compat.v1
flags = tf1.flags
FLAGS = flags.FLAGS

# The flags, of any script, that name directories, checked before work.
PATH_FLAGS = ('data_dir', 'train_dir', 'checkpoint_dir', 'eval_dir',
              'export_dir')

# absl's flags that print the help and exit.
HELP_FLAGS = ('help', '?', 'helpfull', 'helpshort', 'helpxml')

# TensorFlow reports a failed file write as '<path>; <reason>', raised as
# one of its OpErrors (the saver), or as the Python exception its event
# writer turns the error into (IndexError for OUT_OF_RANGE, which a file
# over a size limit, EFBIG, is; RuntimeError for the others).
_FAILED_WRITE = re.compile(r'(\S+); ([^\n\[]+)')
WRITE_ERRORS = (tf.errors.OpError, IndexError, RuntimeError)

# The bytes around each record of an event file (TFRecord): its length and
# the length's checksum before it, the data's checksum after it.
_RECORD_FRAMING_BYTES = 8 + 4 + 4


class Error(Exception):
  """What stops a script, reported as one `Error:` line, no traceback."""


class UsageError(Error):
  """A mistake of the user's: a flag, a path, a command line."""


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
  """Parses flags and runs main(argv); an Error prints one line, exit 1.

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
  except Error as e:
    sys.stderr.write('Error: %s\n' % e)
    sys.exit(1)
  except KeyboardInterrupt:
    sys.stderr.write('Interrupted.\n')
    sys.exit(130)


def tf_reason(error):
  """What an error of TensorFlow's says failed, in one line.

  A graph's error message opens with where the failing op was built
  ('Graph execution error', 'Detected at node', Python frames, 'Node:')
  and ends with the node ('[[{{node ...}}]]'); the reason stands between.

  Args:
    error: an exception, usually a tf.errors.OpError.
  """
  text = getattr(error, 'message', None) or str(error)
  lines = text.strip().splitlines()
  for i, line in enumerate(lines):
    if line.startswith('Node:'):
      lines = lines[i + 1:]
  lines = [l.strip() for l in lines
           if l.strip() and not l.strip().startswith('[[')]
  return lines[0] if lines else type(error).__name__


def failed_write(error, directory):
  """Reads a failed write into directory out of a TensorFlow error.

  A full disk (ResourceExhaustedError), a file-size limit such as
  `ulimit -f` (OutOfRangeError: EFBIG), a read-only or vanished directory:
  TensorFlow names the file and the system's reason.

  Args:
    error: a tf.errors.OpError.
    directory: where the script writes (--train_dir, --eval_dir, ...).

  Returns:
    (the file's path, the reason), or None if error is not a failed write
    into directory.
  """
  match = _FAILED_WRITE.search(str(error))
  if not match or not match.group(1).startswith(directory.rstrip('/') + '/'):
    return None
  return match.group(1), match.group(2).strip()


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
    with quiet_tf_logging():  # tf_record_iterator is deprecated.
      for record in tf1.io.tf_record_iterator(path):
        whole += len(record) + _RECORD_FRAMING_BYTES
  except tf.errors.DataLossError:
    pass  # The half-written record: the file ends in it.
  if whole < os.path.getsize(path):
    os.truncate(path, whole)


def write_advice(reason, flag_name, directory):
  """What to do about a write into directory that failed for reason.

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


@contextlib.contextmanager
def quiet_tf_logging():
  """Keeps TensorFlow's Python warnings (deprecations, 'Checkpoint
  ignored', notes on TF1 APIs) off the console inside the block: ours say
  what matters."""
  logger = tf.get_logger()
  level = logger.level
  logger.setLevel(logging.ERROR)
  try:
    yield
  finally:
    logger.setLevel(level)


def drop_tf_messages(*fragments):
  """Keeps TensorFlow's Python log messages that contain any of fragments
  off the console from now on."""
  tf.get_logger().addFilter(
      lambda record: not any(text in record.getMessage()
                             for text in fragments))


@functools.lru_cache(maxsize=None)
def quiet_event_writer_errors():
  """Keeps the event writer thread's own report of a failed write (its log
  line and its traceback) off the console: the main thread gets the same
  error at its next write or flush, and the script makes it one line."""
  drop_tf_messages('writer thread error')
  quiet_thread_errors(lambda args: args.thread.name == 'EventLoggerThread')


def quiet_thread_errors(is_expected):
  """Keeps the tracebacks of thread errors for which is_expected(args) (of
  threading.excepthook) is True off the console."""
  default_hook = threading.excepthook

  def hook(args):
    if not is_expected(args):
      default_hook(args)
  threading.excepthook = hook
