"""What the machine's devices can run: bfloat16 fast, channels-first at all.

cifar10.py asks before it builds the model: precision_notice() says when
--use_fp16 or --use_bf16 will be slow here (a CPU without bfloat16 units,
a GPU older than Ampere), and nchw_runs_here() whether --data_format=NCHW
can run (GPUs, or TensorFlow's oneDNN on the CPU).
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import functools
import os

import tensorflow as tf

tf1 = tf.compat.v1

# GPUs from this compute capability on have bfloat16 tensor cores (Ampere).
BF16_GPU_CAPABILITY = (8, 0)


def _gpus_without_bf16():
  """The visible GPUs of compute capability below BF16_GPU_CAPABILITY.

  Returns:
    A list of 'GPU:i (name, compute capability x.y)' strings.
  """
  slow = []
  for i, gpu in enumerate(tf.config.list_physical_devices('GPU')):
    details = tf.config.experimental.get_device_details(gpu)
    capability = tuple(details.get('compute_capability') or (0, 0))
    if capability < BF16_GPU_CAPABILITY:
      slow.append('GPU:%d (%s, compute capability %d.%d)' % (
          (i, details.get('device_name', 'unknown')) + capability))
  return slow


def _cpu_has_bf16_units():
  """Returns whether this CPU has bfloat16 units (AVX512_BF16 or AMX)."""
  cpu_flags = set()
  if os.path.exists('/proc/cpuinfo'):
    with open('/proc/cpuinfo') as f:
      cpu_flags = set(f.read().split())
  return bool(cpu_flags & {'avx512_bf16', 'amx_bf16'})


def precision_notice(use_fp16, use_bf16):
  """The notice that a chosen mixed precision will be slow here, or None.

  Args:
    use_fp16: --use_fp16.
    use_bf16: --use_bf16.

  Returns:
    A line starting 'Note:', or None.
  """
  gpus = tf.config.list_physical_devices('GPU')
  if use_fp16 and not gpus:
    return ('Note: --use_fp16 is meant for GPUs; CPUs compute float16 '
            'convolutions many times slower than float32.')
  if not use_bf16:
    return None
  if not gpus and not _cpu_has_bf16_units():
    return ('Note: --use_bf16 on a machine with neither bfloat16 CPU units '
            '(avx512_bf16, amx_bf16) nor a GPU: it will run slower than '
            'float32.')
  slow = _gpus_without_bf16() if gpus else []
  if slow:
    return ('Note: --use_bf16 on %s: GPUs before compute capability %d.%d '
            'have no bfloat16 tensor cores, so it will run slower than '
            'float32; --use_fp16 is the fast mixed precision there.'
            % ((', '.join(slow),) + BF16_GPU_CAPABILITY))
  return None


@functools.lru_cache(maxsize=None)
def nchw_runs_here():
  """Whether the model can run channels-first (NCHW) on this machine.

  GPUs can. TensorFlow's own CPU kernels pool channels-last only; with
  oneDNN (on by default only on CPUs with AVX512_VNNI, AVX512_BF16 or
  AMX) the CPU pools NCHW too. Tried once, on the CPU, in a graph and
  session of its own.
  """
  if tf.config.list_physical_devices('GPU'):
    return True
  with tf.Graph().as_default():
    pool = tf.nn.max_pool2d(tf.zeros([1, 1, 4, 4]), 3, 2, 'SAME',
                            data_format='NCHW')
    try:
      with tf1.Session(config=tf1.ConfigProto(
          device_count={'GPU': 0})) as sess:
        sess.run(pool)
    except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError):
      return False
  return True
