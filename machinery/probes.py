"""Asks this machine what benchmark.py's figures are measured against.

How fast it multiplies matrices in each precision (the peak a training
step's GFLOP/s is a share of), whether oneDNN runs the CPU's ops, whether
a GPU multiplies float32 in TF32, which GPUs there are, and where a step's
heaviest ops actually ran:

  matmul_peak(tf.bfloat16)        # GFLOP/s of a 4096x4096 matmul
  peaks(['float32', 'bfloat16'])  # {'float32': GFLOP/s, ...}
  median_peaks([peaks(...), ...]) # the median of each over the samples
  onednn_on()                     # 'on', 'off' or '?'
  float32_matmuls()               # 'float32' or 'float32 as TF32'
  gpus_line()                     # 'GPUs: ...' or 'no GPU visible: ...'
  devices_ran_on(sess, train_op)  # 'CPU:0', 'GPU:0,GPU:1'
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import time

from machinery import hardware
import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1

MATMUL_SIZE = 4096
# How long to time the matmul of each precision, at least 3 runs.
PEAK_SECONDS = 3.0

# GPUs from this compute capability on (Ampere) multiply float32 matrices
# in TF32, TensorFlow's default there.
TF32_GPU_CAPABILITY = (8, 0)

# The ops whose devices say where a step's work ran.
HEAVY_OPS = ('Conv2D', 'MatMul', '_FusedConv2D', '_FusedMatMul')


def matmul_peak(dtype=tf.float32, n=MATMUL_SIZE):
  """Measures the GFLOP/s of an n x n matmul (4096 unless told): the
  median of 3 to 10 runs, as many as PEAK_SECONDS allow.

  Args:
    dtype: its precision: tf.float32 (on a GPU, as the training steps run
      it: see float32_matmuls), tf.bfloat16 or tf.float16.
    n: the matrices' size.

  Returns:
    The GFLOP/s.
  """
  with tf.Graph().as_default():
    a = tf1.get_variable('a', [n, n], dtype, tf1.ones_initializer())
    b = tf1.get_variable('b', [n, n], dtype, tf1.ones_initializer())
    # Reduce to a scalar on the device, so no copy of the result is timed.
    product = tf.reduce_sum(tf.matmul(a, b))
    with tf1.Session(config=hardware.session_config()) as sess:
      sess.run(tf1.global_variables_initializer())
      sess.run(product)
      times = []
      while len(times) < 10 and (len(times) < 3 or
                                 sum(times) < PEAK_SECONDS):
        start = time.time()
        sess.run(product)
        times.append(time.time() - start)
  return 2.0 * n ** 3 / np.median(times) / 1e9


def peaks(precisions, n=MATMUL_SIZE):
  """Measures the n x n matmul peak of each precision named ('float32',
  'bfloat16', 'float16'); returns {name: GFLOP/s}."""
  return {name: matmul_peak(tf.as_dtype(name), n)
          for name in sorted(precisions)}


def median_peaks(samples):
  """Returns {precision: the median of its peaks} over a list of peaks()
  results, and {precision: (the least, the most)}."""
  return ({name: np.median([sample[name] for sample in samples])
           for name in samples[0]},
          {name: (min(sample[name] for sample in samples),
                  max(sample[name] for sample in samples))
           for name in samples[0]})


def onednn_on():
  """Tells whether oneDNN runs this process's CPU ops: 'on', 'off', or '?'
  where this TensorFlow does not say."""
  try:
    from tensorflow.python.util import _pywrap_util_port  # pylint: disable=g-import-not-at-top
    return 'on' if _pywrap_util_port.IsMklEnabled() else 'off'
  except (ImportError, AttributeError):  # A TensorFlow without it.
    return '?'


def float32_matmuls():
  """Tells how float32 matmuls run here: 'float32', or 'float32 as TF32'
  where a GPU multiplies them in TF32 (a 10-bit mantissa), as TensorFlow
  does by default from Ampere on (tf.config.experimental.
  enable_tensor_float_32_execution turns it off)."""
  if tf.config.experimental.tensor_float_32_execution_enabled() and any(
      capability >= TF32_GPU_CAPABILITY
      for _, capability in hardware.describe_gpus()):
    return 'float32 as TF32'
  return 'float32'


def gpus_line():
  """Names the GPUs TensorFlow sees, or says there is none."""
  gpus = hardware.describe_gpus()
  if not gpus:
    return 'no GPU visible: every row runs on the CPU'
  return 'GPUs: ' + '; '.join(gpu for gpu, _ in gpus)


def devices_ran_on(sess, fetch):
  """Runs fetch once; returns where its heaviest ops ran, e.g. 'GPU:0'.

  The devices of the step's convolutions and matmuls, else of all its
  ops, read from the graphs the session actually ran.
  """
  options = tf1.RunOptions(output_partition_graphs=True)
  metadata = tf1.RunMetadata()
  sess.run(fetch, options=options, run_metadata=metadata)
  placed = [(node.op, node.device) for partition in metadata.partition_graphs
            for node in partition.node]
  heavy = [device for op, device in placed if op.startswith(HEAVY_OPS)]
  return ','.join(sorted({tf.DeviceSpec.from_string(d).to_string().split(
      'device:')[-1] for d in heavy or [d for _, d in placed] if d}))
