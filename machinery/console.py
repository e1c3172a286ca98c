"""Keeps TensorFlow's own chatter off the console where our line says it.

TensorFlow warns about its TF1 APIs, logs failed writes from its threads
and prints the tracebacks of threads that end as expected. Where a script
prints one line of its own that says what matters, these keep TensorFlow's
version of it away:

  with quiet_tf_logging():              # its warnings, inside a block
    tf.compat.v1.train.update_checkpoint_state(...)
  drop_tf_messages('get_checkpoint_mtimes')   # given messages, from now on
  quiet_thread_errors(lambda args: ...)       # threads that end as expected
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import contextlib
import functools
import logging
import threading

import tensorflow as tf


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


def quiet_thread_errors(is_expected):
  """Keeps the tracebacks of thread errors for which is_expected(args) (of
  threading.excepthook) is True off the console."""
  default_hook = threading.excepthook

  def hook(args):
    if not is_expected(args):
      default_hook(args)
  threading.excepthook = hook


@functools.lru_cache(maxsize=None)
def quiet_event_writer_errors():
  """Keeps the event writer thread's own report of a failed write (its log
  line and its traceback) off the console: the main thread gets the same
  error at its next write or flush, and the script makes it one line."""
  drop_tf_messages('writer thread error')
  quiet_thread_errors(lambda args: args.thread.name == 'EventLoggerThread')
