"""Builds the CIFAR-10 network and holds what the trainers and evaluator share.

Summary of available functions:

 # Compute input images and labels for training. If you would like to run
 # evaluations, use inputs() instead.
 inputs, labels = distorted_inputs()

 # Compute inference on the model inputs to make a prediction.
 predictions = inference(inputs)

 # Compute the total loss of the prediction with respect to the labels.
 loss = loss(predictions, labels)

 # Create a graph to run one step of training with respect to the loss.
 train_op = train(loss, global_step)

 # Run the training loop with checkpoints, summaries and step logs.
 run_training(train_op, loss, examples_per_step, num_towers)

Importing this module parses no command line: until a script parses its
flags, every flag reads as its default.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import contextlib
import datetime
import functools
import hashlib
import http.client
import math
import os
import shutil
import signal
import sys
import tarfile
import tempfile
import threading
import time

# Keep TensorFlow's C++ start-up chatter off the console; errors still show.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import app  # pylint: disable=g-import-not-at-top
import numpy as np
from six.moves import urllib
import tensorflow as tf

import cifar10_input

tf1 = tf.compat.v1
flags = tf1.flags
FLAGS = flags.FLAGS

# Basic model parameters.
flags.DEFINE_integer('batch_size', 128,
                     'Number of images to process in a batch.', lower_bound=1)
flags.DEFINE_string('data_dir', '/tmp/cifar10_data',
                    'Path to the CIFAR-10 data directory.')
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
                  'CPUs), NCHW (channels first, fast on GPUs), or auto: '
                  'NCHW when a GPU is visible, else NHWC.')
flags.DEFINE_boolean('xla', False,
                     'Compile the model, its loss and gradients with XLA.')
flags.DEFINE_float('initial_learning_rate', 0.1,
                   'Initial learning rate of the decay schedule.')
flags.DEFINE_string('data_url',
                    'https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz',
                    'Where to get the CIFAR-10 binary archive when data_dir '
                    'lacks it: an http(s):// or file:// URL.')
flags.DEFINE_string('data_md5', '',
                    'md5 the archive must have; empty: the official md5 for '
                    'the official URL, no check for other URLs.')

# Global constants describing the CIFAR-10 data set.
IMAGE_SIZE = cifar10_input.IMAGE_SIZE
NUM_CLASSES = cifar10_input.NUM_CLASSES
NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN = cifar10_input.NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN
NUM_EXAMPLES_PER_EPOCH_FOR_EVAL = cifar10_input.NUM_EXAMPLES_PER_EPOCH_FOR_EVAL

# Constants describing the training process.
MOVING_AVERAGE_DECAY = 0.9999     # The decay to use for the moving average.
NUM_EPOCHS_PER_DECAY = 350.0      # Epochs after which learning rate decays.
LEARNING_RATE_DECAY_FACTOR = 0.1  # Learning rate decay factor.
INITIAL_LEARNING_RATE = 0.1       # Initial learning rate.

# If a model is trained with multiple GPUs, prefix all Op names with tower_name
# to differentiate the operations. Note that this prefix is removed from the
# names of the summaries when visualizing a model.
TOWER_NAME = 'tower'

# Seconds the training session waits for its threads at the end.
STOP_GRACE_PERIOD_SECS = 5

DATA_URL = 'https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz'
DATA_MD5 = 'c32a1d4ab5d03f1284b67883e8d87530'


def _is_positive_number(text):
  """Returns whether text reads as a number above zero."""
  try:
    return float(text) > 0
  except ValueError:
    return False


class UsageError(Exception):
  """A mistake of the user's, reported as one line without a traceback."""


def flag(name):
  """Returns a flag's value: its default until the command line is parsed.

  Args:
    name: the flag's name.

  Returns:
    The value.
  """
  return FLAGS[name].value


def define_trainer_flags(max_steps):
  """Defines the flags both trainers take.

  Args:
    max_steps: the default of --max_steps.
  """
  if 'train_dir' in FLAGS:
    return  # Both trainers imported into one process (tests).
  flags.DEFINE_string('train_dir', '/tmp/cifar10_train',
                      'Directory where to write event logs and checkpoints. '
                      'It is never deleted: a rerun resumes from it.')
  flags.DEFINE_integer('max_steps', max_steps,
                       'Number of batches to run (the global step to stop at).',
                       lower_bound=1)
  flags.DEFINE_boolean('log_device_placement', False,
                       'Whether to log device placement.')
  flags.DEFINE_integer('log_frequency', 10,
                       'How often to log results to the console.',
                       lower_bound=1)
  flags.DEFINE_integer('save_checkpoint_steps', 1000,
                       'Save a checkpoint every this many steps (and at the '
                       'end, and on Ctrl-C or SIGTERM).', lower_bound=1)
  flags.DEFINE_integer('save_summaries_steps', 100,
                       'Write TensorBoard summaries every this many steps.',
                       lower_bound=1)


def scalar_summary(tag, value):
  """Adds a scalar summary tagged exactly `tag`, whatever the name scope.

  tf.summary.scalar would prefix the current name scope (a tower's
  'tower_i/') and uniquify the tag; the raw op keeps it as given, while the
  op itself stays in the scope, so a trainer can pick one tower's summaries.

  Args:
    tag: the TensorBoard tag.
    value: a scalar tensor.
  """
  tf1.add_to_collection(tf1.GraphKeys.SUMMARIES,
                        tf.raw_ops.ScalarSummary(tags=tag, values=value))


def histogram_summary(tag, values):
  """Adds a histogram summary tagged exactly `tag` (see scalar_summary).

  Args:
    tag: the TensorBoard tag.
    values: a tensor.
  """
  tf1.add_to_collection(tf1.GraphKeys.SUMMARIES,
                        tf.raw_ops.HistogramSummary(tag=tag, values=values))


def _activation_summary(x):
  """Helper to create summaries for activations.

  Creates a summary that provides a histogram of activations.
  Creates a summary that measures the sparsity of activations.

  Args:
    x: Tensor
  """
  # Tag by the layer's name alone: 'conv1', not 'tower_0/conv1/conv1'. This
  # helps the clarity of presentation on tensorboard.
  layer_name = x.op.name.split('/')[-1]
  histogram_summary(layer_name + '/activations', x)
  scalar_summary(layer_name + '/sparsity', tf.nn.zero_fraction(x))


def _dtype():
  """Returns the dtype the model computes in, per --use_fp16/--use_bf16."""
  if flag('use_fp16'):
    return tf.float16
  if flag('use_bf16'):
    return tf.bfloat16
  return tf.float32


def _has_bf16_units():
  """Returns whether this CPU has bfloat16 units or a GPU is visible."""
  try:
    with open('/proc/cpuinfo') as f:
      cpu_flags = set(f.read().split())
  except OSError:
    cpu_flags = set()
  return bool(cpu_flags & {'avx512_bf16', 'amx_bf16'} or
              tf.config.list_physical_devices('GPU'))


@functools.lru_cache(maxsize=None)
def _precision_notice():
  """Prints, once, that the chosen precision will be slow here."""
  if flag('use_fp16') and not tf.config.list_physical_devices('GPU'):
    print('Note: --use_fp16 is meant for GPUs; CPUs compute float16 '
          'convolutions many times slower than float32.')
  if flag('use_bf16') and not _has_bf16_units():
    print('Note: --use_bf16 on a machine with neither bfloat16 CPU units '
          '(avx512_bf16, amx_bf16) nor a GPU: it will run slower than '
          'float32.')


def data_format():
  """Returns the layout of the activations, 'NHWC' or 'NCHW'.

  Returns:
    --data_format, with 'auto' resolved to NCHW when a GPU is visible.
  """
  fmt = flag('data_format')
  if fmt == 'auto':
    return 'NCHW' if tf.config.list_physical_devices('GPU') else 'NHWC'
  return fmt


def compile_scope():
  """Returns the scope to build the model in: XLA-compiled with --xla.

  The gradients of ops built in it are compiled too.
  """
  if flag('xla'):
    return tf1.xla.experimental.jit_scope()
  return contextlib.nullcontext()


def _variable_on_cpu(name, shape, initializer, wd=None):
  """Helper to create a Variable stored on CPU memory.

  Variables are float32 always; with --use_fp16 or --use_bf16 the model
  reads them through a cast on its own device (mixed precision).

  Args:
    name: name of the variable
    shape: list of ints
    initializer: initializer for Variable
    wd: add L2Loss weight decay multiplied by this float, computed from
        the float32 variable. If None, weight decay is not added.

  Returns:
    Variable Tensor, in the dtype the model computes in.
  """
  with tf.device('/cpu:0'):
    var = tf1.get_variable(name, shape, initializer=initializer,
                           dtype=tf.float32)
  if wd is not None:
    weight_decay = tf.multiply(tf.nn.l2_loss(var), wd, name='weight_loss')
    tf1.add_to_collection('losses', weight_decay)
  return tf.cast(var, _dtype())


def _variable_with_weight_decay(name, shape, stddev, wd):
  """Helper to create an initialized Variable with weight decay.

  Note that the Variable is initialized with a truncated normal distribution.
  A weight decay is added only if one is specified.

  Args:
    name: name of the variable
    shape: list of ints
    stddev: standard deviation of a truncated Gaussian
    wd: add L2Loss weight decay multiplied by this float. If None, weight
        decay is not added for this Variable.

  Returns:
    Variable Tensor
  """
  return _variable_on_cpu(
      name, shape, tf1.truncated_normal_initializer(stddev=stddev), wd)


def distorted_batches(num_batches):
  """Distorted training batches, distinct ones, from one input pipeline.

  Args:
    num_batches: how many batches each step takes (one per tower).

  Returns:
    A list of num_batches (images, labels) pairs: images
    [batch_size, IMAGE_SIZE, IMAGE_SIZE, 3], labels [batch_size].
  """
  batches = cifar10_input.distorted_batches(
      data_dir=flag('data_dir'), batch_size=flag('batch_size'),
      num_batches=num_batches)
  return [(tf.cast(images, _dtype()), labels) for images, labels in batches]


def distorted_inputs():
  """Constructs distorted input for CIFAR training using the Reader ops.

  Returns:
    images: Images. 4D tensor of [batch_size, IMAGE_SIZE, IMAGE_SIZE, 3] size.
    labels: Labels. 1D tensor of [batch_size] size.
  """
  return distorted_batches(1)[0]


def inputs(eval_data):
  """Constructs input for CIFAR evaluation using the Reader ops.

  Args:
    eval_data: bool, indicating if one should use the train or eval data set.

  Returns:
    images: Images. 4D tensor of [batch_size, IMAGE_SIZE, IMAGE_SIZE, 3] size.
    labels: Labels. 1D tensor of [batch_size] size.
  """
  images, labels = cifar10_input.inputs(
      eval_data=eval_data, data_dir=flag('data_dir'),
      batch_size=flag('batch_size'))
  return tf.cast(images, _dtype()), labels


# The tutorial's local response normalization: depth radius, bias, alpha,
# beta of tf.nn.lrn.
LRN_DEPTH_RADIUS = 4
LRN_BIAS = 1.0
LRN_ALPHA = 0.001 / 9.0
LRN_BETA = 0.75


def _lrn_band(channels, scale):
  """Returns scale times the [channels, channels] 0/1 band of LRN windows."""
  distance = np.abs(np.arange(channels)[:, None] - np.arange(channels))
  return (scale * (distance <= LRN_DEPTH_RADIUS)).astype(np.float32)


@tf.custom_gradient
def _lrn_rows(x):
  """LRN over the last axis of a [rows, channels] float32 matrix.

  Args:
    x: a [rows, channels] float32 tensor.

  Returns:
    The normalized rows, and the function that maps their gradient to x's.
  """
  channels = int(x.shape[-1])
  # d = bias + alpha * (sum of the squares in each window); y = x * d**-beta.
  d = LRN_BIAS + tf.matmul(tf.square(x), _lrn_band(channels, LRN_ALPHA))
  assert LRN_BETA == 0.75  # d ** -0.75 as rsqrt(d) * sqrt(rsqrt(d)) below.
  r = tf.math.rsqrt(d)
  scale = r * tf.sqrt(r)
  y = x * scale

  def grad(dy):
    # dx_i = dy_i * d_i**-beta
    #        - 2 * alpha * beta * x_i * sum_{j in window i} dy_j * y_j / d_j.
    window = tf.matmul(dy * y / d,
                       _lrn_band(channels, 2 * LRN_ALPHA * LRN_BETA))
    return dy * scale - x * window

  return y, grad


def _lrn(x, name, fmt):
  """The tutorial's local response normalization, in float32, over channels.

  The same function as tf.nn.lrn(x, 4, bias=1.0, alpha=0.001 / 9.0,
  beta=0.75): each value divided by (bias + alpha * the sum of the squares
  of the 9 nearest channels) ** 0.75. The window sums are matmuls with a
  band matrix, and the gradient is written out in 6 ops; on CPUs this
  trains several times faster than tf.nn.lrn's LRNGrad kernel.

  Args:
    x: activations, in layout fmt.
    name: the op's name.
    fmt: 'NHWC' or 'NCHW'.

  Returns:
    The normalized activations, like x.
  """
  with tf1.name_scope(name) as scope:
    y = tf.cast(x, tf.float32)
    if fmt == 'NCHW':
      y = tf.transpose(y, [0, 2, 3, 1])
    shape = tf.shape(y)
    y = tf.reshape(_lrn_rows(tf.reshape(y, [-1, int(y.shape[-1])])), shape)
    if fmt == 'NCHW':
      y = tf.transpose(y, [0, 3, 1, 2])
    return tf.identity(tf.cast(y, x.dtype), name=scope)


def _pool(x, name, fmt):
  """The tutorial's 3x3 max pooling with stride 2."""
  size = [1, 1, 3, 3] if fmt == 'NCHW' else [1, 3, 3, 1]
  stride = [1, 1, 2, 2] if fmt == 'NCHW' else [1, 2, 2, 1]
  return tf.nn.max_pool2d(x, ksize=size, strides=stride, padding='SAME',
                          data_format=fmt, name=name)


def inference(images):
  """Build the CIFAR-10 model.

  Args:
    images: Images returned from distorted_inputs() or inputs(), NHWC.

  Returns:
    Logits, [batch_size, NUM_CLASSES].
  """
  fmt = data_format()
  _precision_notice()
  with compile_scope():
    if fmt == 'NCHW':
      images = tf.transpose(images, [0, 3, 1, 2])
    # conv1
    with tf1.variable_scope('conv1') as scope:
      kernel = _variable_with_weight_decay('weights', shape=[5, 5, 3, 64],
                                           stddev=5e-2, wd=None)
      conv = tf.nn.conv2d(images, kernel, [1, 1, 1, 1], padding='SAME',
                          data_format=fmt)
      biases = _variable_on_cpu('biases', [64], tf1.constant_initializer(0.0))
      pre_activation = tf.nn.bias_add(conv, biases, data_format=fmt)
      conv1 = tf.nn.relu(pre_activation, name=scope.name)
      _activation_summary(conv1)

    # pool1
    pool1 = _pool(conv1, 'pool1', fmt)
    # norm1
    norm1 = _lrn(pool1, 'norm1', fmt)

    # conv2
    with tf1.variable_scope('conv2') as scope:
      kernel = _variable_with_weight_decay('weights', shape=[5, 5, 64, 64],
                                           stddev=5e-2, wd=None)
      conv = tf.nn.conv2d(norm1, kernel, [1, 1, 1, 1], padding='SAME',
                          data_format=fmt)
      biases = _variable_on_cpu('biases', [64], tf1.constant_initializer(0.1))
      pre_activation = tf.nn.bias_add(conv, biases, data_format=fmt)
      conv2 = tf.nn.relu(pre_activation, name=scope.name)
      _activation_summary(conv2)

    # norm2
    norm2 = _lrn(conv2, 'norm2', fmt)
    # pool2
    pool2 = _pool(norm2, 'pool2', fmt)
    if fmt == 'NCHW':
      # Flatten in NHWC order, so the weights below mean the same in both
      # layouts and checkpoints are interchangeable.
      pool2 = tf.transpose(pool2, [0, 2, 3, 1])

    # local3
    with tf1.variable_scope('local3') as scope:
      # Move everything into depth so we can perform a single matrix multiply.
      batch_size = images.get_shape()[0]
      reshape = tf.reshape(pool2, [batch_size, -1])
      dim = reshape.get_shape()[1]
      weights = _variable_with_weight_decay('weights', shape=[dim, 384],
                                            stddev=0.04, wd=0.004)
      biases = _variable_on_cpu('biases', [384],
                                tf1.constant_initializer(0.1))
      local3 = tf.nn.relu(tf.matmul(reshape, weights) + biases,
                          name=scope.name)
      _activation_summary(local3)

    # local4
    with tf1.variable_scope('local4') as scope:
      weights = _variable_with_weight_decay('weights', shape=[384, 192],
                                            stddev=0.04, wd=0.004)
      biases = _variable_on_cpu('biases', [192],
                                tf1.constant_initializer(0.1))
      local4 = tf.nn.relu(tf.matmul(local3, weights) + biases,
                          name=scope.name)
      _activation_summary(local4)

    # linear layer(WX + b),
    # We don't apply softmax here because
    # tf.nn.sparse_softmax_cross_entropy_with_logits accepts the unscaled
    # logits and performs the softmax internally for efficiency.
    with tf1.variable_scope('softmax_linear') as scope:
      weights = _variable_with_weight_decay('weights', [192, NUM_CLASSES],
                                            stddev=1 / 192.0, wd=None)
      biases = _variable_on_cpu('biases', [NUM_CLASSES],
                                tf1.constant_initializer(0.0))
      softmax_linear = tf.add(tf.matmul(local4, weights), biases,
                              name=scope.name)
      _activation_summary(softmax_linear)

  return softmax_linear


def loss(logits, labels):
  """Add L2Loss to all the trainable variables.

  Add summary for "Loss" and "Loss/avg".
  Args:
    logits: Logits from inference().
    labels: Labels from distorted_inputs or inputs(). 1-D tensor
            of shape [batch_size]

  Returns:
    Loss tensor of type float.
  """
  # Calculate the average cross entropy loss across the batch.
  labels = tf.cast(labels, tf.int64)
  cross_entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=labels, logits=tf.cast(logits, tf.float32),
      name='cross_entropy_per_example')
  cross_entropy_mean = tf.reduce_mean(cross_entropy, name='cross_entropy')
  tf1.add_to_collection('losses', cross_entropy_mean)

  # The total loss is defined as the cross entropy loss plus all of the weight
  # decay terms (L2 loss).
  return tf.add_n(tf1.get_collection('losses'), name='total_loss')


def _add_loss_summaries(total_loss):
  """Add summaries for losses in CIFAR-10 model.

  Generates moving average for all losses and associated summaries for
  visualizing the performance of the network.

  Args:
    total_loss: Total loss from loss().
  Returns:
    loss_averages_op: op for generating moving averages of losses.
  """
  # Compute the moving average of all individual losses and the total loss.
  loss_averages = tf1.train.ExponentialMovingAverage(0.9, name='avg')
  losses = tf1.get_collection('losses')
  loss_averages_op = loss_averages.apply(losses + [total_loss])

  # Attach a scalar summary to all individual losses and the total loss; do the
  # same for the averaged version of the losses.
  for l in losses + [total_loss]:
    # Name each loss as '(raw)' and name the moving average version of the loss
    # as the original loss name.
    scalar_summary(l.op.name + ' (raw)', l)
    scalar_summary(l.op.name, loss_averages.average(l))

  return loss_averages_op


def learning_rate(global_step, examples_per_step):
  """The tutorial's staircase decay, counting epochs in examples.

  Args:
    global_step: the global step tensor.
    examples_per_step: examples one step consumes (over all towers).

  Returns:
    The learning rate tensor, with a 'learning_rate' summary.
  """
  num_batches_per_epoch = NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN / examples_per_step
  decay_steps = int(num_batches_per_epoch * NUM_EPOCHS_PER_DECAY)
  lr = tf1.train.exponential_decay(flag('initial_learning_rate'),
                                   global_step,
                                   decay_steps,
                                   LEARNING_RATE_DECAY_FACTOR,
                                   staircase=True)
  scalar_summary('learning_rate', lr)
  return lr


def optimizer(lr):
  """The tutorial's gradient descent; with --use_fp16, with loss scaling.

  Float16 gradients of small values flush to zero: the loss is multiplied
  by the loss scale before the gradients are taken and they are divided by
  it after. A dynamic scale halves on an overflow (and that step is
  skipped) and doubles after 2000 good steps.

  Args:
    lr: the learning rate.

  Returns:
    A tf.compat.v1.train.Optimizer.
  """
  opt = tf1.train.GradientDescentOptimizer(lr)
  if not flag('use_fp16'):
    return opt
  if flag('loss_scale') == 'dynamic':
    scale = tf1.mixed_precision.DynamicLossScale()
  else:
    scale = tf1.mixed_precision.FixedLossScale(float(flag('loss_scale')))
  scalar_summary('loss_scale', scale())
  return tf1.mixed_precision.MixedPrecisionLossScaleOptimizer(opt, scale)


def variable_averages(global_step):
  """Returns the moving averages of the trained variables that eval uses.

  Args:
    global_step: the global step, which sets the averages' warm-up.

  Returns:
    A tf.compat.v1.train.ExponentialMovingAverage.
  """
  return tf1.train.ExponentialMovingAverage(MOVING_AVERAGE_DECAY, global_step)


def apply_gradients(opt, grads, global_step, average=True):
  """Applies gradients, then updates the variables' moving averages.

  Args:
    opt: the optimizer.
    grads: list of (gradient, variable) pairs.
    global_step: the global step, incremented by the update.
    average: whether to update the moving averages here (False where the
      optimizer updates them itself).

  Returns:
    train_op: op for one training step.
  """
  apply_gradient_op = opt.apply_gradients(grads, global_step=global_step)

  # Add histograms for trainable variables and their gradients.
  for var in tf1.trainable_variables():
    histogram_summary(var.op.name, var)
  for grad, var in grads:
    if grad is not None and var.trainable:
      histogram_summary(var.op.name + '/gradients', grad)
  if not average:
    return apply_gradient_op

  # Track the moving averages of all trainable variables, from the values
  # the gradient step has just written.
  with tf.control_dependencies([apply_gradient_op]):
    variables_averages_op = variable_averages(global_step).apply(
        tf1.trainable_variables())
  return variables_averages_op


def train(total_loss, global_step):
  """Train CIFAR-10 model.

  Create an optimizer and apply to all trainable variables. Add moving
  average for all trainable variables.

  Args:
    total_loss: Total loss from loss().
    global_step: Integer Variable counting the number of training steps
      processed.
  Returns:
    train_op: op for training.
  """
  lr = learning_rate(global_step, flag('batch_size'))

  # Generate moving averages of all losses and associated summaries.
  loss_averages_op = _add_loss_summaries(total_loss)

  # Compute gradients.
  with tf.control_dependencies([loss_averages_op]):
    opt = optimizer(lr)
    grads = opt.compute_gradients(total_loss)

  return apply_gradients(opt, grads, global_step)


class NanLossError(Exception):
  """The loss became NaN or infinite."""

  def __init__(self, step, value):
    super(NanLossError, self).__init__('step %d, loss = %s' % (step, value))
    self.step = step
    self.value = value


class _StepCounter(tf1.train.SessionRunHook):
  """Base hook that knows the global step of the run in progress."""

  def __init__(self):
    self.step = 0

  def after_create_session(self, session, coord):
    self.step = session.run(tf1.train.get_global_step())

  def after_run(self, run_context, run_values):
    self.step += 1


class NanLossHook(_StepCounter):
  """Stops training with NanLossError when the loss is not finite."""

  def __init__(self, loss):
    super(NanLossHook, self).__init__()
    self._loss = loss

  def before_run(self, run_context):
    return tf1.train.SessionRunArgs(self._loss)

  def after_run(self, run_context, run_values):
    if not math.isfinite(run_values.results):
      raise NanLossError(self.step, run_values.results)
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


def _rewind_to_finite_checkpoint(train_dir):
  """Makes the newest checkpoint whose values are all finite the latest.

  The step before a NaN loss may already have written non-finite weights,
  and a checkpoint may have been saved from them. Those checkpoints stay on
  disk but leave the checkpoint state, so a rerun resumes from good ones.

  Args:
    train_dir: the directory of the checkpoints.

  Returns:
    The path of that checkpoint, or None if there is none.
  """
  state = tf1.train.get_checkpoint_state(train_dir)
  paths = list(state.all_model_checkpoint_paths) if state else []
  while paths:
    reader = tf.train.load_checkpoint(paths[-1])
    if all(np.all(np.isfinite(reader.get_tensor(name)))
           for name, dtype in reader.get_variable_to_dtype_map().items()
           if dtype.is_floating):
      tf1.train.update_checkpoint_state(train_dir, paths[-1],
                                        all_model_checkpoint_paths=paths)
      return paths[-1]
    paths.pop()
  return None


def run_training(train_op, loss, examples_per_step, num_towers=1,
                 config=None, scaffold=None, master='', is_chief=True,
                 hooks=(), log_prefix=''):
  """Runs train_op in a MonitoredTrainingSession over --train_dir.

  Resumes from the latest checkpoint there, stops at --max_steps, logs
  every --log_frequency steps, writes summaries and checkpoints, and on
  SIGINT/SIGTERM saves a checkpoint and stops.

  Args:
    train_op: the op for one step.
    loss: the loss tensor to log and check for NaN.
    examples_per_step: examples one step consumes over all towers.
    num_towers: towers per step, for the sec/batch figure.
    config: a tf.compat.v1.ConfigProto, or None.
    scaffold: a tf.compat.v1.train.Scaffold (for a summary op other than
      all summaries), or None.
    master: the TensorFlow server to run on; '' runs in this process.
    is_chief: whether this task initializes or restores the model and
      writes checkpoints and summaries (distributed training).
    hooks: more SessionRunHooks.
    log_prefix: text to start each step line with.

  Returns:
    The number of steps this process ran.

  Raises:
    UsageError: the loss became NaN.
  """
  train_dir = FLAGS.train_dir
  latest = tf1.train.latest_checkpoint(train_dir)
  if latest and is_chief:
    print('Resuming from %s.' % latest)
  signal_hook = StopOnSignalHook()
  all_hooks = list(hooks) + [
      NanLossHook(loss),
      tf1.train.StopAtStepHook(last_step=FLAGS.max_steps),
      signal_hook,
      LoggerHook(loss, FLAGS.log_frequency, examples_per_step, num_towers,
                 log_prefix),
  ]
  # After the NaN check, so a diverged step is never saved.
  chief_only_hooks = [tf1.train.CheckpointSaverHook(
      train_dir, save_steps=FLAGS.save_checkpoint_steps, scaffold=scaffold)]
  steps_run = 0
  try:
    with tf1.train.MonitoredTrainingSession(
        master=master,
        is_chief=is_chief,
        checkpoint_dir=train_dir,
        scaffold=scaffold,
        hooks=all_hooks,
        chief_only_hooks=chief_only_hooks,
        save_checkpoint_secs=None,
        save_checkpoint_steps=None,
        save_summaries_steps=FLAGS.save_summaries_steps,
        config=config,
        stop_grace_period_secs=STOP_GRACE_PERIOD_SECS) as mon_sess:
      while not mon_sess.should_stop():
        mon_sess.run(train_op)
        steps_run += 1
  except NanLossError as e:
    raise UsageError(
        'Model diverged with loss = %s at step %d. The last good checkpoint, '
        '%s, is kept. Lower --initial_learning_rate (now %g) and run again '
        'to resume from it.' % (e.value, e.step,
                                _rewind_to_finite_checkpoint(train_dir)
                                if is_chief else 'of the chief',
                                FLAGS.initial_learning_rate))
  if signal_hook.received is not None:
    print('Stopped by signal %d; checkpoint saved in %s.'
          % (signal_hook.received, tf1.train.latest_checkpoint(train_dir)))
  return steps_run


def session_config():
  """Returns the session config of the trainers.

  Returns:
    A tf.compat.v1.ConfigProto with soft placement and, if asked for,
    device placement logging.
  """
  return tf1.ConfigProto(allow_soft_placement=True,
                         log_device_placement=FLAGS.log_device_placement)


def _download(url, filepath):
  """Downloads url to filepath, via a temporary file, with a progress line.

  Args:
    url: http(s):// or file:// URL.
    filepath: where the file ends up.

  Raises:
    UsageError: the download failed or was cut short.
  """
  filename = os.path.basename(filepath)
  # A file of its own, so that tasks downloading at once do not mix.
  fd, partial = tempfile.mkstemp(prefix=filename + '.', suffix='.part',
                                 dir=os.path.dirname(filepath))
  try:
    with os.fdopen(fd, 'wb') as out, \
        urllib.request.urlopen(url, timeout=60) as response:
      total = int(response.headers.get('Content-Length') or 0)
      received = 0
      while True:
        chunk = response.read(1 << 20)
        if not chunk:
          break
        out.write(chunk)
        received += len(chunk)
        if total:
          sys.stdout.write('\r>> Downloading %s %.1f%%' %
                           (filename, 100.0 * received / total))
        else:
          sys.stdout.write('\r>> Downloading %s %.1f MB' %
                           (filename, received / 1e6))
        sys.stdout.flush()
    print()
    if total and received != total:
      raise IOError('got %d of %d bytes' % (received, total))
  except (IOError, OSError, ValueError, http.client.HTTPException) as e:
    if os.path.exists(partial):
      os.remove(partial)
    raise UsageError(
        'Failed to download %s: %s. Check --data_url (a file:// URL works for '
        'a local copy of cifar-10-binary.tar.gz) or extract the archive into '
        '--data_dir.' % (url, getattr(e, 'reason', e)))
  os.chmod(partial, 0o644)
  os.rename(partial, filepath)
  print('Successfully downloaded', filename, os.path.getsize(filepath),
        'bytes.')


def _md5(filepath):
  """Returns the hex md5 of a file."""
  digest = hashlib.md5()
  with open(filepath, 'rb') as f:
    for chunk in iter(lambda: f.read(1 << 20), b''):
      digest.update(chunk)
  return digest.hexdigest()


def maybe_download_and_extract():
  """Download and extract the tarball from Alex's website.

  Does nothing when <data_dir>/cifar-10-batches-bin exists. Otherwise gets
  the archive from --data_url (unless it already lies in data_dir),
  checks its md5, extracts it into a temporary directory and renames that
  into place, so that no reader ever sees a half-extracted directory.

  Raises:
    UsageError: the download failed, or the archive is corrupt or not
      CIFAR-10.
  """
  dest_directory = flag('data_dir')
  extracted_dir_path = os.path.join(dest_directory, cifar10_input.BATCHES_DIR)
  if os.path.isdir(extracted_dir_path):
    return
  os.makedirs(dest_directory, exist_ok=True)
  url = flag('data_url')
  filename = url.split('/')[-1] or 'cifar-10-binary.tar.gz'
  filepath = os.path.join(dest_directory, filename)
  if not os.path.exists(filepath):
    _download(url, filepath)
  expected_md5 = flag('data_md5') or (DATA_MD5 if url == DATA_URL else None)
  actual_md5 = _md5(filepath) if expected_md5 else None
  if actual_md5 != expected_md5:
    raise UsageError(
        'Archive %s has md5 %s, not %s: it is corrupt or not the CIFAR-10 '
        'binary archive. Delete it and run again, or pass the right '
        '--data_md5.' % (filepath, actual_md5, expected_md5))
  staging = tempfile.mkdtemp(prefix='.extracting-', dir=dest_directory)
  try:
    with tarfile.open(filepath, 'r:gz') as tar:
      tar.extractall(staging, filter='data')
    extracted = os.path.join(staging, cifar10_input.BATCHES_DIR)
    if not os.path.isdir(extracted):
      raise UsageError('Archive %s holds no %s directory: it is not the '
                       'CIFAR-10 binary archive.'
                       % (filepath, cifar10_input.BATCHES_DIR))
    try:
      os.rename(extracted, extracted_dir_path)
    except OSError:
      if not os.path.isdir(extracted_dir_path):  # Not a concurrent extractor.
        raise
  except (tarfile.TarError, EOFError, OSError) as e:
    raise UsageError('Failed to extract %s: %s. Delete it and run again.'
                     % (filepath, e))
  finally:
    shutil.rmtree(staging, ignore_errors=True)


def _parse_flags(argv):
  """Parses the command line; a bad flag is one line and exit code 2."""
  try:
    return FLAGS(argv)
  except flags.Error as e:
    sys.stderr.write('Error: %s. See --help.\n' % str(e).rstrip('.'))
    sys.exit(2)


def run_main(main):
  """Parses flags and runs main(argv); user errors print one line, exit 1.

  Args:
    main: the script's main function, taking argv.
  """
  def checked_main(argv):
    if len(argv) > 1:
      raise UsageError('Unexpected arguments %s. See --help.'
                       % ' '.join(argv[1:]))
    if not FLAGS['verbosity'].present:
      # Step lines, not TensorFlow's INFO log, unless -v/--verbosity says so.
      tf1.logging.set_verbosity(tf1.logging.WARN)
    return main(argv)
  try:
    app.run(checked_main, flags_parser=_parse_flags)
  except (UsageError, cifar10_input.DataError) as e:
    sys.stderr.write('Error: %s\n' % e)
    sys.exit(1)
  except KeyboardInterrupt:
    sys.stderr.write('Interrupted.\n')
    sys.exit(130)
