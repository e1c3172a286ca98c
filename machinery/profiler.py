"""Where a training step's time goes: op time per step, by layer and op.

Traces steps of a session's train op (RunOptions FULL_TRACE) and adds up
each op's time, counted once, by device, layer (the first scope of its
name, its gradient's included) and op type:

  profile = profile_steps(sess, train_op, steps=10)
  print_profile(profile, steps=10)
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import collections
import re

import tensorflow as tf

tf1 = tf.compat.v1


def profile_steps(sess, train_op, steps):
  """Traces steps of train_op in sess and adds up their ops' times.

  Args:
    sess: the session, warmed up.
    train_op: the step.
    steps: how many steps to trace.

  Returns:
    A list of ((device, layer, op type), milliseconds per step), the
    largest first. The device is 'CPU:0', 'GPU:0', ...
  """
  totals = collections.Counter()
  options = tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE)
  for _ in range(steps):
    metadata = tf1.RunMetadata()
    sess.run(train_op, options=options, run_metadata=metadata)
    for device, name, op_type, micros in op_times(metadata.step_stats):
      totals[device, layer_of(name), op_type or '?'] += micros
  return [(key, micros / steps / 1e3) for key, micros in totals.most_common()]


def layer_of(op_name):
  """Names the layer an op belongs to: the first scope of its name, that
  of the op it is the gradient of for a gradient ('conv1' for
  'gradients/conv1/Conv2D_grad/Conv2DBackpropFilter')."""
  layer = op_name.replace('gradients/', '', 1).split('/')[0]
  return layer[:-len('_grad')] if layer.endswith('_grad') else layer


def op_times(step_stats):
  """Reads the time of each op of a traced step, each counted once.

  A CPU's ops are its device's records. A GPU's are recorded twice: as the
  executor launches them (device '.../device:GPU:0', microseconds of
  launch, not of work) and as kernels on its CUDA streams
  ('.../device:GPU:0/stream:7', where 'stream:all' repeats every stream);
  they are taken from the numbered streams only.

  Args:
    step_stats: a StepStats, from RunMetadata.

  Returns:
    A list of (device, op name, op type, microseconds), the device as
    'CPU:0' or 'GPU:0'.
  """
  times = []
  for device in step_stats.dev_stats:
    name = device.device.upper()
    stream = re.search(r'DEVICE:(GPU:\d+)/STREAM:\d+$', name)
    cpu = re.search(r'DEVICE:(CPU:\d+)$', name)
    if not stream and not cpu:
      continue  # A GPU's launch records, its 'stream:all', its memcpy.
    for node in device.node_stats:
      micros = node.op_end_rel_micros - node.op_start_rel_micros
      if stream:
        # GPU trace records name themselves 'op name:OpType'.
        op_name, _, op_type = node.node_name.partition(':')
      else:
        # timeline_label reads 'name = OpType(inputs)'.
        op_name = node.node_name
        op_type = node.timeline_label.partition(' = ')[2].partition('(')[0]
      times.append(((stream or cpu).group(1), op_name, op_type, micros))
  return times


def print_profile(profile, steps, what='train row'):
  """Prints profile_steps' result, device by device: the ops that take 1%
  or more of that device's time (a GPU's kernels are a small part of a
  step whose variables are updated on the CPU)."""
  for device in sorted({device for (device, _, _), _ in profile}):
    ops = [(key[1:], ms) for key, ms in profile if key[0] == device]
    total = sum(ms for _, ms in ops)
    print()
    print('%s op time on %s, one op at a time: %.1f ms per step over '
          '%d traced steps' % (what, device, total, steps))
    for (layer, op_type), ms in ops:
      if ms >= total / 100:
        print('%8.2f ms %5.1f%%  %-24s %s' % (ms, 100 * ms / total, layer,
                                              op_type))
