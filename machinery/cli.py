"""Runs a script's main from its command line: flags in, one clear line out.

Every script ends with

  if __name__ == '__main__':
    cli.run_main(main)

which parses its flags (a bad one is one `Error:` line and exit status
2; --help prints them and exits 0), checks its directory flags before any
work starts, says when the chosen precision will be slow here, runs main,
and turns an errors.Error raised anywhere (a user's mistake, missing
data, no readable checkpoint, a full disk) into one `Error:` line and exit
status 1, without a traceback.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import gc
import os
import sys

from absl import app
from machinery import errors
from machinery import options
import tensorflow as tf

tf1 = tf.compat.v1
flags = tf1.flags
FLAGS = flags.FLAGS

# The flags, of any script, that name directories, checked before work.
PATH_FLAGS = ('data_dir', 'train_dir', 'checkpoint_dir', 'eval_dir',
              'export_dir')

# absl's flags that print the help and exit.
HELP_FLAGS = ('help', '?', 'helpfull', 'helpshort', 'helpxml')


def _path_problem(path):
  """Says what keeps path from being a directory, as a phrase, or None.

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
    errors.UsageError: a directory flag names a file, or a path no
      directory can be made at.
  """
  for name in PATH_FLAGS:
    if name in FLAGS and getattr(FLAGS, name) is not None:
      problem = _path_problem(getattr(FLAGS, name))
      if problem:
        raise errors.UsageError('--%s=%s: %s. Give a directory there.'
                                % (name, getattr(FLAGS, name), problem))


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


def _precision_notice():
  """Prints that the precision the flags chose will be slow on this machine
  (options.precision_notice), if it will."""
  notice = options.precision_notice()
  if notice:
    print(notice)


def run_main(main, takes_arguments=False, defaults=None):
  """Parses flags and runs main(argv); an Error prints one line, exit 1.

  Every directory flag is checked first (check_path_flags), and the script
  says when --use_fp16 or --use_bf16 will be slow here.

  Args:
    main: the script's main function, taking argv; what it returns is the
      exit status.
    takes_arguments: whether arguments other than flags are the script's.
    defaults: {flag name: default} of this script's own, set before the
      command line is read (--help shows them), e.g. --max_steps.
  """
  for name, value in (defaults or {}).items():
    FLAGS.set_default(name, value)
  def checked_main(argv):
    if len(argv) > 1 and not takes_arguments:
      raise errors.UsageError('Unexpected arguments %s. See --help.'
                              % ' '.join(argv[1:]))
    if not FLAGS['verbosity'].present:
      # Step lines, not TensorFlow's INFO log, unless -v/--verbosity says so.
      tf1.logging.set_verbosity(tf1.logging.WARN)
    check_path_flags()
    _precision_notice()
    return main(argv)
  # What is loaded by now (TensorFlow: some 350,000 Python objects) lives
  # until the script ends. Frozen, Python's collector neither walks it at
  # each full collection nor takes it apart at exit: about 2 core-seconds
  # less per script on a 2-core AVX2 CPU (docs/testing.md).
  gc.freeze()
  try:
    app.run(checked_main, flags_parser=_parse_flags)
  except errors.Error as e:
    sys.stderr.write('Error: %s\n' % e)
    sys.exit(1)
  except KeyboardInterrupt:
    sys.stderr.write('Interrupted.\n')
    sys.exit(130)
