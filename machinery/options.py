"""Defines the options for speed: mixed precision, the layout, XLA.

Each keeps the same model and checkpoints (float32 variables with the
same names); docs/options.md says how each works and what it gives. A
script reads them once, from_flags(), and hands the Options to the
model, which builds with them in one line each:

  opts = options.from_flags()                  # or options.DEFAULT
  images = tf.cast(images, opts.compute_dtype())   # --use_fp16, --use_bf16
  with opts.compiled():                        # --xla
    ...
  conv = tf.nn.conv2d(..., data_format=opts.data_format())
  opt = opts.scale_loss(opt)                   # --use_fp16's loss scaling

PORTABLE builds the model in float32, channels last and uncompiled (the
SavedModel cifar10_predict.py exports, which every CPU build of
TensorFlow runs).
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import collections
import contextlib

from machinery import hardware
from machinery import summaries
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


# The flags that change how the model is built.
BUILD_FLAGS = ('data_format', 'use_fp16', 'use_bf16', 'xla')


class Options(collections.namedtuple('Options', [
    'use_fp16', 'use_bf16', 'loss_scale_value', 'layout', 'xla'])):
  """How the model is built and computes: the values of --use_fp16,
  --use_bf16, --loss_scale, --data_format and --xla."""

  def compute_dtype(self):
    """Returns the dtype the model computes in."""
    if self.use_fp16:
      return tf.float16
    if self.use_bf16:
      return tf.bfloat16
    return tf.float32

  def data_format(self):
    """Returns the layout, 'auto' resolved for where the model is built.

    The layout follows the device: channels first (NCHW, cuDNN's fastest
    in float32) for a model built for a GPU; channels last (NHWC) on a CPU
    and for float16 and bfloat16, which tensor cores compute channels last
    (as TensorFlow's layout optimizer and NVIDIA's guides have it). A model
    is built for the device of the current device scope (a tower's), or,
    with none, for a GPU where one is visible (TensorFlow places it there).
    """
    if self.layout != 'auto':
      return self.layout
    if self.compute_dtype() != tf.float32:
      return 'NHWC'
    device = _device_of_scope()
    if device:
      on_gpu = tf.DeviceSpec.from_string(device).device_type == 'GPU'
    else:
      on_gpu = bool(tf.config.list_physical_devices('GPU'))
    return 'NCHW' if on_gpu else 'NHWC'

  def compiled(self):
    """Returns a context in which the ops built, and later their gradients,
    are compiled with XLA (with --xla), or one that does nothing."""
    if not self.xla:
      return contextlib.nullcontext()
    return tf1.xla.experimental.jit_scope()

  def scale_loss(self, opt):
    """Returns opt, or with --use_fp16 opt scaling the loss by
    loss_scale(), its scale summarized as 'loss_scale'."""
    scale = self.loss_scale()
    if scale is None:
      return opt
    summaries.scalar_summary('loss_scale', scale())
    return tf1.mixed_precision.MixedPrecisionLossScaleOptimizer(opt, scale)

  def loss_scale(self):
    """Makes --use_fp16's loss scale (--loss_scale); None without it.

    Float16 gradients of small values flush to zero: the loss is
    multiplied by the loss scale before the gradients are taken and they
    are divided by it after. A dynamic scale halves on an overflow (and
    that step is skipped) and doubles after 2000 good steps.
    """
    if not self.use_fp16:
      return None
    if self.loss_scale_value == 'dynamic':
      return tf1.mixed_precision.DynamicLossScale()
    return tf1.mixed_precision.FixedLossScale(float(self.loss_scale_value))


# The flags' defaults: float32, the layout for the device, no XLA.
DEFAULT = Options(use_fp16=False, use_bf16=False, loss_scale_value='dynamic',
                  layout='auto', xla=False)
# As every CPU build of TensorFlow runs it (NCHW pooling needs a GPU or
# oneDNN): float32, channels last, uncompiled.
PORTABLE = DEFAULT._replace(layout='NHWC')


def from_flags():
  """Returns the Options the command line asks for."""
  return Options(use_fp16=FLAGS.use_fp16, use_bf16=FLAGS.use_bf16,
                 loss_scale_value=FLAGS.loss_scale,
                 layout=FLAGS.data_format, xla=FLAGS.xla)


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


def _device_of_scope():
  """Returns the device an op built here is placed on by the device scope
  ('' for none, or outside a graph), read off a NoOp built for the
  purpose."""
  if tf.executing_eagerly():
    return ''
  return tf.no_op(name='device_of_scope').device
