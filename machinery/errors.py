"""Names what stops a script: each error class is named for what happened.

A script raises one of these where it can say what went wrong and what to
do; cli.run_main prints it as one `Error:` line and exits with status 1,
without a traceback:

  raise errors.DataError('Failed to find file: ... Get the data with ...')

tf_reason() reads the one line that matters out of a TensorFlow error.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function


class Error(Exception):
  """Stops a script with one `Error:` line and no traceback."""


class UsageError(Error):
  """A mistake on the command line: a flag, a path, an argument, TF_CONFIG."""


class DataError(Error):
  """The data cannot be had: a failed download, a missing or bad file."""


class CheckpointError(Error):
  """No checkpoint to use: none there, none readable, or not this model's."""


class WriteError(Error):
  """A write failed: a full disk, a file-size limit, a read-only directory."""


class LockError(Error):
  """Another trainer holds --train_dir, or its filesystem takes no locks."""


class OutOfMemoryError(Error):
  """A step needs more memory than the machine or its device has."""


class DivergedError(Error):
  """The loss became NaN or infinite: training diverged."""


class PeerGoneError(Error):
  """A distributed worker lost a peer it all-reduces with."""


class ModelError(Error):
  """The model failed to run on inputs that are fine."""


def tf_reason(error):
  """Reads what an error of TensorFlow's says failed, in one line.

  A graph's error message opens with where the failing op was built
  ('Graph execution error', 'Detected at node', Python frames, 'Node:')
  and ends with the node ('[[{{node ...}}]]'); the reason stands between.

  Args:
    error: an exception, usually a tf.errors.OpError.

  Returns:
    The reason's line, or the error's class name where there is none.
  """
  text = getattr(error, 'message', None) or str(error)
  lines = text.strip().splitlines()
  for i, line in enumerate(lines):
    if line.startswith('Node:'):
      lines = lines[i + 1:]
  lines = [l.strip() for l in lines
           if l.strip() and not l.strip().startswith('[[')]
  return lines[0] if lines else type(error).__name__
