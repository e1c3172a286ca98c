"""Keeps a second trainer out of a --train_dir while one trains in it.

Two trainers in one directory would overwrite each other's checkpoints.
The training session holds the lock while it runs:

  held = lock.hold('/tmp/cifar10_train')   # errors.LockError if taken
  ...
  held.close()

It is an flock on <train_dir>/trainer.lock, a file that names its holder;
the kernel releases it when the process ends, even by kill -9.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import fcntl
import os
import socket
import sys

from machinery import errors

# The file in --train_dir that the training process holds a lock on.
LOCK_FILE = 'trainer.lock'


def hold(train_dir):
  """Takes the lock that keeps a second trainer out of train_dir.

  Local paths only: a 'scheme://' train_dir is not locked.

  Args:
    train_dir: the trainer's --train_dir, made if it does not exist.

  Returns:
    The open lock file, to close when training ends, or None.

  Raises:
    errors.LockError: another live process holds the lock, or the
      filesystem takes no locks.
    errors.WriteError: the lock file cannot be made there.
  """
  if '://' in train_dir:
    return None
  path = os.path.join(train_dir, LOCK_FILE)
  try:
    os.makedirs(train_dir, exist_ok=True)
    lock = open(path, 'a+')
  except OSError as e:
    raise errors.WriteError(
        'Cannot make the lock file %s: %s. Check that --train_dir=%s can be '
        'written to.' % (path, e.strerror or e, train_dir))
  try:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:  # Another process holds it.
    lock.seek(0)
    holder = lock.read().strip() or 'another process'
    lock.close()
    raise errors.LockError(
        '--train_dir=%s is in use by %s. Wait for it to end or stop it, or '
        'train in another --train_dir.' % (train_dir, holder))
  except OSError as e:  # This filesystem takes no locks.
    lock.close()
    raise errors.LockError(
        'Cannot lock %s: %s. Give a --train_dir on a local filesystem.'
        % (path, e.strerror or e))
  lock.truncate(0)
  lock.write('process %d on %s (%s)\n' % (os.getpid(), socket.gethostname(),
                                          ' '.join(sys.argv)))
  lock.flush()
  return lock
