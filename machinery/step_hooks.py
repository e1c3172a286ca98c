"""Defines the hooks the trainers' sessions run at every step.

session.training_session adds them around every step: the tutorial's
step line (LoggerHook) and its stop on a NaN loss (NanLossHook), a clean
stop on Ctrl-C or SIGTERM (StopOnSignalHook) and a trace of the steps
--trace_steps lists (TraceHook):

  hooks=[NanLossHook(loss, learning_rate=0.1),
         LoggerHook(loss, log_frequency=10, examples_per_step=128)]

A distributed worker's session also runs its StallReportHook, which says
when a step waits for a missing worker.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import datetime
import math
import os
import signal
import sys
import threading
import time

import tensorflow as tf
# The Chrome trace of a step's statistics, as tf.compat.v1.train.ProfilerHook
# writes it.
from tensorflow.python.client import timeline  # pylint: disable=g-direct-tensorflow-import

from machinery import summaries

tf1 = tf.compat.v1


class NanLossError(Exception):
  """Stops the session when the loss became NaN or infinite.

  Attributes:
    step: the step whose loss it was.
    value: the loss.
    learning_rate: the run's --initial_learning_rate, to say what to lower.
    step_rate: the rate that step used (its 'learning_rate' summary, scaled
      and warmed up), or None in a graph without that summary.
  """

  def __init__(self, step, value, learning_rate, step_rate):
    super(NanLossError, self).__init__('step %d, loss = %s' % (step, value))
    self.step = step
    self.value = value
    self.learning_rate = learning_rate
    self.step_rate = step_rate


class _StepCounter(tf1.train.SessionRunHook):
  """Knows the global step of the run in progress (a base hook)."""

  def __init__(self):
    self.step = 0

  def after_create_session(self, session, coord):
    self.step = session.run(tf1.train.get_global_step())

  def after_run(self, run_context, run_values):
    self.step += 1


class NanLossHook(_StepCounter):
  """Stops training with NanLossError when the loss is not finite; the
  error names learning_rate (--initial_learning_rate) as what to lower, and
  the rate the step used (the graph's 'learning_rate' summary): with
  --learning_rate_scaling or a warm-up the two differ."""

  def __init__(self, loss, learning_rate):
    super(NanLossHook, self).__init__()
    self._fetches = {'loss': loss}
    self._learning_rate = learning_rate

  def begin(self):
    rate = summaries.summarized('learning_rate')
    if rate is not None:
      self._fetches['rate'] = rate

  def before_run(self, run_context):
    return tf1.train.SessionRunArgs(self._fetches)

  def after_run(self, run_context, run_values):
    loss = run_values.results['loss']
    if not math.isfinite(loss):
      raise NanLossError(self.step, loss, self._learning_rate,
                         run_values.results.get('rate'))
    super(NanLossHook, self).after_run(run_context, run_values)


class LoggerHook(_StepCounter):
  """Prints the step, loss and speed every log_frequency steps."""

  def __init__(self, loss, log_frequency, examples_per_step, num_towers=1,
               prefix=''):
    super(LoggerHook, self).__init__()
    self._prefix = prefix
    self._loss = loss
    self._log_frequency = log_frequency
    self._examples_per_step = examples_per_step
    self._num_towers = num_towers
    self._start_time = None
    self._start_step = 0

  def after_create_session(self, session, coord):
    super(LoggerHook, self).after_create_session(session, coord)
    self._start_time = time.time()
    self._start_step = self.step

  def before_run(self, run_context):
    if self.step % self._log_frequency == 0:
      return tf1.train.SessionRunArgs(self._loss)
    return None

  def after_run(self, run_context, run_values):
    if self.step % self._log_frequency == 0:
      current_time = time.time()
      duration = ((current_time - self._start_time) /
                  (self.step + 1 - self._start_step))
      self._start_time = current_time
      self._start_step = self.step + 1
      examples_per_sec = self._examples_per_step / duration
      sec_per_batch = duration / self._num_towers
      format_str = ('%s%s: step %d, loss = %.2f (%.1f examples/sec; %.3f '
                    'sec/batch)')
      print(format_str % (self._prefix, datetime.datetime.now(), self.step,
                          run_values.results, examples_per_sec,
                          sec_per_batch))
      sys.stdout.flush()
    super(LoggerHook, self).after_run(run_context, run_values)


class StopOnSignalHook(tf1.train.SessionRunHook):
  """Turns SIGINT and SIGTERM into a clean stop after the current step.

  The session then ends normally, so the checkpoint saver writes a
  checkpoint at the step reached. A second signal interrupts at once.
  """

  SIGNALS = (signal.SIGINT, signal.SIGTERM)

  def __init__(self):
    self.received = None
    self._previous = {}

  def _handle(self, signum, frame):
    del frame
    if self.received is not None:
      raise KeyboardInterrupt
    self.received = signum

  def begin(self):
    if threading.current_thread() is not threading.main_thread():
      return  # Python takes signals in the main thread only.
    for signum in self.SIGNALS:
      self._previous[signum] = signal.signal(signum, self._handle)

  def after_run(self, run_context, run_values):
    if self.received is not None:
      run_context.request_stop()

  def end(self, session):
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)


class TraceHook(_StepCounter):
  """Traces the steps listed: which op ran on which device, and when.

  At each listed global step (the step a step line names), the step runs
  with a full trace. Its timeline goes to output_dir as a Chrome trace,
  trace-step-<step>.json (chrome://tracing, ui.perfetto.dev,
  docs/plot_timeline.py), and its run metadata to the event file there,
  as run 'step_<step>' of TensorBoard's Graphs tab: compute time, memory
  and device of every node. Steps not listed run as usual.
  """

  def __init__(self, steps, output_dir, prefix=''):
    super(TraceHook, self).__init__()
    self._steps = set(steps)
    self._output_dir = output_dir
    self._prefix = prefix

  def before_run(self, run_context):
    if self.step not in self._steps:
      return None
    return tf1.train.SessionRunArgs(None, options=tf1.RunOptions(
        trace_level=tf1.RunOptions.FULL_TRACE, output_partition_graphs=True))

  def after_run(self, run_context, run_values):
    if self.step in self._steps:
      self._save(self.step, run_values.run_metadata)
    super(TraceHook, self).after_run(run_context, run_values)

  def _save(self, step, run_metadata):
    path = os.path.join(self._output_dir, 'trace-step-%d.json' % step)
    with tf.io.gfile.GFile(path, 'w') as f:
      f.write(timeline.Timeline(run_metadata.step_stats)
              .generate_chrome_trace_format(show_memory=True))
    tf1.summary.FileWriterCache.get(self._output_dir).add_run_metadata(
        run_metadata, 'step_%d' % step, global_step=step)
    print('%sStep %d traced: %s (chrome://tracing, ui.perfetto.dev); its run '
          'metadata is run "step_%d" in TensorBoard\'s Graphs tab.'
          % (self._prefix, step, path, step))
    sys.stdout.flush()


class StallReportHook(tf1.train.SessionRunHook):
  """Prints a notice when one step waits longer than a limit."""

  def __init__(self, seconds, message):
    super(StallReportHook, self).__init__()
    self._seconds = seconds
    self._message = message
    self._timer = None

  def before_run(self, run_context):
    self._timer = threading.Timer(self._seconds, print, [self._message])
    self._timer.daemon = True
    self._timer.start()

  def after_run(self, run_context, run_values):
    self._timer.cancel()

  def end(self, session):
    if self._timer:
      self._timer.cancel()
