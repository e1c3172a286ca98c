"""Keeps a second trainer out of a --train_dir while one trains in it, and
a second evaluator out of an --eval_dir.

Two trainers in one directory would overwrite each other's checkpoints;
two evaluators, each other's event file (the same name: the second's
time and host). The training session holds the lock while it runs, the
evaluator while it evaluates:

  held = lock.hold('/tmp/cifar10_train')   # errors.LockError if taken
  ...
  held.close()
  held = lock.hold('/tmp/cifar10_eval', EVALUATOR)

The lock is <train_dir>/trainer.lock (<eval_dir>/evaluator.lock), a file
that names its holder. On
Linux and macOS it is an flock on that file, which the kernel releases
when the process ends, even by kill -9. Where there is no fcntl
(Windows), the file itself is the lock: made only if it does not exist,
removed when training ends; one left by a process that is gone (killed,
or the machine restarted) is taken over.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import collections
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


class Holder(collections.namedtuple('Holder', ['flag', 'lock_file', 'work'])):
  """Who holds a directory's lock: its flag ('train_dir'), its lock file,
  and what the error line advises to do instead ('train')."""


TRAINER = Holder('train_dir', LOCK_FILE, 'train')
EVALUATOR = Holder('eval_dir', 'evaluator.lock', 'evaluate')

# How a lock file names its holder, and how that is read back.
_HOLDER = 'process %d on %s (%s)\n'
_HOLDER_PID_HOST = re.compile(r'^process (\d+) on (\S+) ')


def hold(train_dir, holder=TRAINER):
  """Takes the lock that keeps a second trainer (evaluator) out of
  train_dir (its --eval_dir).

  Local paths only: a 'scheme://' train_dir is not locked.

  Args:
    train_dir: the trainer's --train_dir, made if it does not exist.
    holder: TRAINER, or EVALUATOR for an --eval_dir.

  Returns:
    The held lock, to close() when training ends, or None.

  Raises:
    errors.LockError: another live process holds the lock, or the
      filesystem takes no locks.
    errors.WriteError: the lock file cannot be made there.
  """
  if '://' in train_dir:
    return None
  path = os.path.join(train_dir, holder.lock_file)
  try:
    os.makedirs(train_dir, exist_ok=True)
    if fcntl:
      return _flock(path, train_dir, holder)
    return _exclusive_file(path, train_dir, holder)
  except OSError as e:
    raise errors.WriteError(
        'Cannot make the lock file %s: %s. Check that --%s=%s can be '
        'written to.' % (path, e.strerror or e, holder.flag, train_dir))


def _in_use(train_dir, holder, by, hint=''):
  """Makes the LockError of a directory another process holds (by)."""
  return errors.LockError(
      '--%s=%s is in use by %s. Wait for it to end or stop it, or %s in '
      'another --%s.%s' % (holder.flag, train_dir, by, holder.work,
                           holder.flag, hint))


def _holder():
  """Names this process, for the lock file."""
  return _HOLDER % (os.getpid(), socket.gethostname(), ' '.join(sys.argv))


def _flock(path, train_dir, holder):
  """Holds an flock on path (Linux, macOS): the kernel releases it when
  the process ends. Returns the open file."""
  lock = open(path, 'a+')
  try:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:  # Another process holds it.
    lock.seek(0)
    by = lock.read().strip() or 'another process'
    lock.close()
    raise _in_use(train_dir, holder, by)
  except OSError as e:  # This filesystem takes no locks.
    lock.close()
    raise errors.LockError(
        'Cannot lock %s: %s. Give a --%s on a local filesystem.'
        % (path, e.strerror or e, holder.flag))
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


def _exclusive_file(path, train_dir, holder):
  """Holds path as a lock without fcntl: made only if it does not exist.

  A lock file whose process is gone is taken over; one of another machine
  (a shared filesystem) cannot be checked, and counts as held.
  """
  for _ in range(2):
    try:
      fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
      with open(path) as f:
        by = f.read().strip()
      if _holder_alive(by):
        raise _in_use(train_dir, holder, by or 'another process',
                      ' Where it no longer runs, delete %s.' % path)
      try:
        os.remove(path)  # Its process is gone: take the lock over.
      except FileNotFoundError:
        pass
      continue
    with os.fdopen(fd, 'w') as f:
      f.write(_holder())
    return _ExclusiveFile(path)
  raise _in_use(train_dir, holder, 'another process')


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
