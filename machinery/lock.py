"""Keeps a second trainer out of a --train_dir while one trains in it.

Two trainers in one directory would overwrite each other's checkpoints.
The training session holds the lock while it runs:

  held = lock.hold('/tmp/cifar10_train')   # errors.LockError if taken
  ...
  held.close()

The lock is <train_dir>/trainer.lock, a file that names its holder. On
Linux and macOS it is an flock on that file, which the kernel releases
when the process ends, even by kill -9. Where there is no fcntl
(Windows), the file itself is the lock: made only if it does not exist,
removed when training ends; one left by a process that is gone (killed,
or the machine restarted) is taken over.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import ctypes
import os
import re
import socket
import sys

from machinery import errors

try:
  import fcntl  # pylint: disable=g-import-not-at-top
except ImportError:  # Windows.
  fcntl = None

# The file in --train_dir that the training process holds a lock on.
LOCK_FILE = 'trainer.lock'

# How a lock file names its holder, and how that is read back.
_HOLDER = 'process %d on %s (%s)\n'
_HOLDER_PID_HOST = re.compile(r'^process (\d+) on (\S+) ')


def hold(train_dir):
  """Takes the lock that keeps a second trainer out of train_dir.

  Local paths only: a 'scheme://' train_dir is not locked.

  Args:
    train_dir: the trainer's --train_dir, made if it does not exist.

  Returns:
    The held lock, to close() when training ends, or None.

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
    if fcntl:
      return _flock(path, train_dir)
    return _exclusive_file(path, train_dir)
  except OSError as e:
    raise errors.WriteError(
        'Cannot make the lock file %s: %s. Check that --train_dir=%s can be '
        'written to.' % (path, e.strerror or e, train_dir))


def _in_use(train_dir, holder, hint=''):
  """Makes the LockError of a train_dir another trainer holds."""
  return errors.LockError(
      '--train_dir=%s is in use by %s. Wait for it to end or stop it, or '
      'train in another --train_dir.%s' % (train_dir, holder, hint))


def _holder():
  """Names this process, for the lock file."""
  return _HOLDER % (os.getpid(), socket.gethostname(), ' '.join(sys.argv))


def _flock(path, train_dir):
  """Holds an flock on path (Linux, macOS): the kernel releases it when
  the process ends. Returns the open file."""
  lock = open(path, 'a+')
  try:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:  # Another process holds it.
    lock.seek(0)
    holder = lock.read().strip() or 'another process'
    lock.close()
    raise _in_use(train_dir, holder)
  except OSError as e:  # This filesystem takes no locks.
    lock.close()
    raise errors.LockError(
        'Cannot lock %s: %s. Give a --train_dir on a local filesystem.'
        % (path, e.strerror or e))
  lock.truncate(0)
  lock.write(_holder())
  lock.flush()
  return lock


class _ExclusiveFile(object):
  """Holds a lock file made exclusively; close() removes it."""

  def __init__(self, path):
    self._path = path

  def close(self):
    """Releases the lock: removes the file."""
    try:
      os.remove(self._path)
    except FileNotFoundError:
      pass  # Removed by hand: nothing left to release.


def _exclusive_file(path, train_dir):
  """Holds path as a lock without fcntl: made only if it does not exist.

  A lock file whose process is gone is taken over; one of another machine
  (a shared filesystem) cannot be checked, and counts as held.
  """
  for _ in range(2):
    try:
      fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
      with open(path) as f:
        holder = f.read().strip()
      if _holder_alive(holder):
        raise _in_use(train_dir, holder or 'another process',
                      ' Where it no longer runs, delete %s.' % path)
      try:
        os.remove(path)  # Its process is gone: take the lock over.
      except FileNotFoundError:
        pass
      continue
    with os.fdopen(fd, 'w') as f:
      f.write(_holder())
    return _ExclusiveFile(path)
  raise _in_use(train_dir, 'another process')


def _holder_alive(holder):
  """Tells whether the process a lock file names may still run.

  Args:
    holder: the lock file's text ('process 42 on host (...)').

  Returns:
    False only where the process is known to be gone: it ran on this
    machine and no process has its id now.
  """
  match = _HOLDER_PID_HOST.match(holder)
  if not match or match.group(2) != socket.gethostname():
    return True
  return _process_exists(int(match.group(1)))


def _process_exists(pid):
  """Tells whether a process of this id runs on this machine."""
  if os.name == 'nt':
    return _windows_process_exists(pid)
  try:
    os.kill(pid, 0)  # Signal 0: only asks whether it could be sent.
  except ProcessLookupError:
    return False
  except PermissionError:
    return True  # Another user's process.
  return True


def _windows_process_exists(pid):
  """Tells whether a process of this id runs, on Windows (where os.kill
  would end it)."""
  query_limited_information, still_active, access_denied = 0x1000, 259, 5
  kernel32 = ctypes.WinDLL('kernel32', use_last_error=True)
  handle = kernel32.OpenProcess(query_limited_information, False, pid)
  if not handle:
    return ctypes.get_last_error() == access_denied
  code = ctypes.c_ulong()
  try:
    kernel32.GetExitCodeProcess(handle, ctypes.byref(code))
  finally:
    kernel32.CloseHandle(handle)
  return code.value == still_active
