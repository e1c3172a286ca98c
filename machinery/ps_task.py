"""What a parameter-server task does: serve the variables until the workers
are done.

A ps task builds no model and runs no step of its own: its server holds
the variables the workers place on it and runs the ops they send. It only
has to stay up until every worker has finished, and then exit, rather than
wait for ever as server.join() would. Each worker, as it ends, puts a done
token on a queue on every ps task; a ps task exits once it has one from
every worker (or on Ctrl-C or SIGTERM):

  serve(server, task)         # a ps task, until the workers are done
  say_done(server, task)      # a worker, as it ends
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import signal
import threading

import tensorflow as tf

tf1 = tf.compat.v1

# Seconds between checks for Ctrl-C while a ps task waits.
POLL_SECS = 0.5

# How long a worker tries to give a ps task its token.
DONE_TIMEOUT_MS = 10000


def _done_queue(ps_task, num_workers):
  """Returns the queue on ps task ps_task where each worker puts a done
  token."""
  with tf.device('/job:ps/task:%d' % ps_task):
    return tf1.FIFOQueue(num_workers, tf.int32,
                         shared_name='done_queue_%d' % ps_task)


def serve(server, task):
  """Serves the variables until every worker has said it is done.

  SIGINT (Ctrl-C) or SIGTERM stops it sooner.

  Args:
    server: this ps task's tf.distribute.Server.
    task: the ps task's cluster.Task.
  """
  num_workers = len(task.worker_hosts)
  received = []
  for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, lambda signum, frame: received.append(signum))
  with tf.Graph().as_default():
    dequeue = _done_queue(task.task_index, num_workers).dequeue()
    config = tf1.ConfigProto(
        device_filters=['/job:ps/task:%d' % task.task_index])
    sess = tf1.Session(server.target, config=config)

    def count_done():
      try:
        for done in range(num_workers):
          sess.run(dequeue)
          print('%s: %d of %d workers done.'
                % (task.log_name, done + 1, num_workers))
      except tf.errors.CancelledError:
        pass  # The session was closed: stopped by a signal.
    print('%s serving; it exits when all %d workers are done (Ctrl-C stops '
          'it sooner).' % (task.log_name, num_workers))
    # The main thread stays in Python, where signals are handled.
    counter = threading.Thread(target=count_done, daemon=True)
    counter.start()
    while counter.is_alive() and not received:
      counter.join(POLL_SECS)
    # Closing the session ends the wait in the thread, which must not be
    # in TensorFlow when the interpreter exits.
    sess.close()
    counter.join()
  if received:
    print('%s: stopped by signal %d.' % (task.log_name, received[0]))


def say_done(server, task):
  """Puts this worker's done token on every ps task's queue."""
  num_workers = len(task.worker_hosts)
  with tf.Graph().as_default():
    enqueues = [_done_queue(i, num_workers).enqueue(1)
                for i in range(len(task.ps_hosts))]
    # The session needs the ps tasks only, not the other workers, which
    # may have gone.
    config = tf1.ConfigProto(device_filters=['/job:ps'])
    try:
      with tf1.Session(server.target, config=config) as sess:
        sess.run(enqueues,
                 options=tf1.RunOptions(timeout_in_ms=DONE_TIMEOUT_MS))
    except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
            tf.errors.AbortedError):
      pass  # A ps task that is gone (or hangs) needs no token.
