"""Defines the options for speed: mixed precision, the layout, XLA.

Each keeps the same model and checkpoints (float32 variables with the
same names); docs/options.md says how each works and what it gives.
cifar10.py builds the model with them in one line each:

  images = tf.cast(images, compute_dtype())   # --use_fp16, --use_bf16
  @compiled                                   # --xla
  def inference(images): ...
  conv = tf.nn.conv2d(..., data_format=data_format())
  scale = loss_scale()                        # --use_fp16's loss scaling

and with portable(): builds the model in float32, channels last and
uncompiled whatever the flags say (the SavedModel cifar10_predict.py
exports, which every CPU build of TensorFlow runs).
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import contextlib
import functools

from machinery import hardware
import tensorflow as tf

tf1 = tf.compat.v1
flags = tf1.flags
FLAGS = flags.FLAGS

flags.DEFINE_boolean('use_fp16', False,
                     'Mixed precision: compute in float16, keep float32 '
                     'variables, scale the loss (see --loss_scale).')
flags.DEFINE_boolean('use_bf16', False,
                     'Mixed precision: compute in bfloat16, keep float32 '
                     'variables (no loss scaling). Fast on CPUs with '
                     'bfloat16 units (AVX512_BF16, AMX) and recent GPUs.')
flags.register_multi_flags_validator(
    ['use_fp16', 'use_bf16'], lambda f: not (f['use_fp16'] and f['use_bf16']),
    message='--use_fp16 and --use_bf16 exclude each other: choose one')
flags.DEFINE_string('loss_scale', 'dynamic',
                    "Loss scale with --use_fp16: 'dynamic' or a number.")
flags.register_validator(
    'loss_scale', lambda v: v == 'dynamic' or _is_positive_number(v),
    message="--loss_scale must be 'dynamic' or a positive number")
flags.DEFINE_enum('data_format', 'auto', ['auto', 'NHWC', 'NCHW'],
                  'Layout of the activations: NHWC (channels last, fast on '
                  'CPUs and on tensor cores), NCHW (channels first, cuDNN\'s '
                  'float32 layout), or auto: NCHW for a model built for a GPU '
                  'in float32, else NHWC.')
flags.register_validator(
    'data_format', lambda fmt: fmt != 'NCHW' or hardware.nchw_runs_here(),
    message='it needs a GPU, or a TensorFlow that pools '
    'channels-first on the CPU (oneDNN, on by default only on CPUs with '
    'AVX512_VNNI, AVX512_BF16 or AMX); this machine has neither: use NHWC '
    'or auto')
flags.DEFINE_boolean('xla', False,
                     'Compile the model (inference) and its gradients with '
                     'XLA.')


# The flags that change how the model is built (portable() sets them
# aside).
BUILD_FLAGS = ('data_format', 'use_fp16', 'use_bf16', 'xla')

# Holds True while the model is built portable (portable()).
_portable = []


@contextlib.contextmanager
def portable():
  """Inside the block, the model is built in float32, channels last (NHWC)
  and uncompiled, whatever BUILD_FLAGS say: as every CPU build of
  TensorFlow runs it (NCHW pooling needs a GPU or oneDNN)."""
  _portable.append(True)
  try:
    yield
  finally:
    _portable.pop()


def _is_positive_number(text):
  """Returns whether text reads as a number above zero."""
  try:
    return float(text) > 0
  except ValueError:
    return False


def precision_notice():
  """Returns the line that says --use_fp16 or --use_bf16 will be slow on
  this machine (hardware.precision_notice), or None."""
  return hardware.precision_notice(FLAGS.use_fp16, FLAGS.use_bf16)


def compute_dtype():
  """Returns the dtype the model computes in, per --use_fp16/--use_bf16."""
  if _portable:
    return tf.float32
  if FLAGS.use_fp16:
    return tf.float16
  if FLAGS.use_bf16:
    return tf.bfloat16
  return tf.float32


def data_format():
  """Returns --data_format, 'auto' resolved for where the model is built.

  The layout follows the device: channels first (NCHW, cuDNN's fastest in
  float32) for a model built for a GPU; channels last (NHWC) on a CPU and
  for float16 and bfloat16, which tensor cores compute channels last (as
  TensorFlow's layout optimizer and NVIDIA's guides have it). A model is
  built for the device of the current device scope (a tower's), or, with
  none, for a GPU where one is visible (TensorFlow places it there).
  """
  fmt = 'NHWC' if _portable else FLAGS.data_format
  if fmt != 'auto':
    return fmt
  if compute_dtype() != tf.float32:
    return 'NHWC'
  device = _device_of_scope()
  if device:
    on_gpu = tf.DeviceSpec.from_string(device).device_type == 'GPU'
  else:
    on_gpu = bool(tf.config.list_physical_devices('GPU'))
  return 'NCHW' if on_gpu else 'NHWC'


def _device_of_scope():
  """Returns the device an op built here is placed on by the device scope
  ('' for none, or outside a graph), read off a NoOp built for the
  purpose."""
  if tf.executing_eagerly():
    return ''
  return tf.no_op(name='device_of_scope').device


def compiled(build):
  """Makes a model-building function build under XLA with --xla.

  The ops it builds, and later their gradients, are compiled with XLA
  (tf.compat.v1.xla.experimental.jit_scope) when --xla is set as it is
  called; without --xla it builds as it is.

  Args:
    build: a function that builds the model, e.g. cifar10.inference.

  Returns:
    The function, wrapped.
  """
  @functools.wraps(build)
  def build_compiled(*args, **kwargs):
    if _portable or not FLAGS.xla:
      return build(*args, **kwargs)
    with tf1.xla.experimental.jit_scope():
      return build(*args, **kwargs)
  return build_compiled


def loss_scale():
  """Makes --use_fp16's loss scale (--loss_scale); None without it.

  Float16 gradients of small values flush to zero: the loss is multiplied
  by the loss scale before the gradients are taken and they are divided by
  it after. A dynamic scale halves on an overflow (and that step is
  skipped) and doubles after 2000 good steps.
  """
  if not FLAGS.use_fp16:
    return None
  if FLAGS.loss_scale == 'dynamic':
    return tf1.mixed_precision.DynamicLossScale()
  return tf1.mixed_precision.FixedLossScale(float(FLAGS.loss_scale))
