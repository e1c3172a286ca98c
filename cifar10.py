"""Builds the CIFAR-10 network: the model the trainers and evaluator share.

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

The scripts run these in a training session (cifar10_session.py) on data
from cifar10_input.py. Importing this module parses no command line: until
a script parses its flags, every flag reads as its default.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import contextlib
import functools
import os

# Keep TensorFlow's C++ start-up chatter off the console; errors still show.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf

import cifar10_devices
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
flags.register_validator(
    'data_format', lambda fmt: fmt != 'NCHW' or cifar10_devices.nchw_runs_here(),
    message='it needs a GPU, or a TensorFlow that pools '
    'channels-first on the CPU (oneDNN, on by default only on CPUs with '
    'AVX512_VNNI, AVX512_BF16 or AMX); this machine has neither: use NHWC '
    'or auto')
flags.DEFINE_boolean('xla', False,
                     'Compile the model, its loss and gradients with XLA.')
flags.DEFINE_float('initial_learning_rate', 0.1,
                   'Initial learning rate of the decay schedule.')
flags.DEFINE_string('data_url', cifar10_input.DATA_URL,
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

# The tutorial's local response normalization: depth radius, bias, alpha,
# beta of tf.nn.lrn.
LRN_DEPTH_RADIUS = 4
LRN_BIAS = 1.0
LRN_ALPHA = 0.001 / 9.0
LRN_BETA = 0.75


def flag(name):
  """Returns a flag's value: its default until the command line is parsed."""
  return FLAGS[name].value


def _is_positive_number(text):
  """Returns whether text reads as a number above zero."""
  try:
    return float(text) > 0
  except ValueError:
    return False


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
      # (Any batch size: the exported model takes a batch of any length.)
      dim = int(np.prod(pool2.get_shape()[1:]))
      reshape = tf.reshape(pool2, [-1, dim])
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


def _lrn_band(channels, scale):
  """Returns scale times the [channels, channels] 0/1 band of LRN windows."""
  distance = np.abs(np.arange(channels)[:, None] - np.arange(channels))
  return (scale * (distance <= LRN_DEPTH_RADIUS)).astype(np.float32)


@tf.custom_gradient
def _lrn_rows(x):
  """LRN over the last axis of a [rows, channels] float32 matrix.

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

  Returns:
    The normalized activations x (layout fmt, 'NHWC' or 'NCHW'), as op
    `name`.
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


def _dtype():
  """Returns the dtype the model computes in, per --use_fp16/--use_bf16."""
  if flag('use_fp16'):
    return tf.float16
  if flag('use_bf16'):
    return tf.bfloat16
  return tf.float32


@functools.lru_cache(maxsize=None)
def _precision_notice():
  """Prints, once, that the chosen precision will be slow here."""
  notice = cifar10_devices.precision_notice(flag('use_fp16'), flag('use_bf16'))
  if notice:
    print(notice)


def data_format():
  """Returns --data_format, 'auto' resolved to NCHW when a GPU is visible."""
  fmt = flag('data_format')
  if fmt == 'auto':
    return 'NCHW' if tf.config.list_physical_devices('GPU') else 'NHWC'
  return fmt


def compile_scope():
  """The scope to build the model in: XLA, gradients included, with --xla."""
  if flag('xla'):
    return tf1.xla.experimental.jit_scope()
  return contextlib.nullcontext()


def _variable_on_cpu(name, shape, initializer, wd=None):
  """Creates a float32 variable on /cpu:0, with weight decay if wd is given.

  With --use_fp16 or --use_bf16 the model reads it through a cast on its
  own device (mixed precision); the weight decay, wd * l2_loss, is taken
  from the float32 variable and added to the 'losses' collection.

  Returns:
    The variable, in the dtype the model computes in.
  """
  with tf.device('/cpu:0'):
    var = tf1.get_variable(name, shape, initializer=initializer,
                           dtype=tf.float32)
  if wd is not None:
    weight_decay = tf.multiply(tf.nn.l2_loss(var), wd, name='weight_loss')
    tf1.add_to_collection('losses', weight_decay)
  return tf.cast(var, _dtype())


def _variable_with_weight_decay(name, shape, stddev, wd):
  """A variable initialized from a truncated normal (see _variable_on_cpu)."""
  return _variable_on_cpu(
      name, shape, tf1.truncated_normal_initializer(stddev=stddev), wd)


def scalar_summary(tag, value):
  """Adds a scalar summary tagged exactly `tag`, whatever the name scope.

  tf.summary.scalar would prefix the current name scope (a tower's
  'tower_i/') and uniquify the tag; the raw op keeps it as given, while the
  op itself stays in the scope, so a trainer can pick one tower's summaries.
  """
  tf1.add_to_collection(tf1.GraphKeys.SUMMARIES,
                        tf.raw_ops.ScalarSummary(tags=tag, values=value))


def histogram_summary(tag, values):
  """Adds a histogram summary tagged exactly `tag` (see scalar_summary)."""
  tf1.add_to_collection(tf1.GraphKeys.SUMMARIES,
                        tf.raw_ops.HistogramSummary(tag=tag, values=values))


def _activation_summary(x):
  """Adds a histogram of a layer's activations and their sparsity."""
  # Tag by the layer's name alone: 'conv1', not 'tower_0/conv1/conv1'.
  layer_name = x.op.name.split('/')[-1]
  histogram_summary(layer_name + '/activations', x)
  scalar_summary(layer_name + '/sparsity', tf.nn.zero_fraction(x))


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
  """One distorted training batch: (images, labels) (see distorted_batches)."""
  return distorted_batches(1)[0]


def inputs(eval_data):
  """Constructs input for CIFAR evaluation: central crops, in file order.

  Args:
    eval_data: bool, True for the test set, False for the training set.

  Returns:
    images [batch_size, IMAGE_SIZE, IMAGE_SIZE, 3], labels [batch_size].
  """
  images, labels = cifar10_input.inputs(
      eval_data=eval_data, data_dir=flag('data_dir'),
      batch_size=flag('batch_size'))
  return tf.cast(images, _dtype()), labels


def image_file_inputs(contents):
  """The model's input from a [batch] string tensor of image files (JPEG,
  PNG, BMP or GIF, any size), prepared as inputs() prepares the test
  images (see cifar10_input.image_from_file)."""
  images = tf.map_fn(cifar10_input.image_from_file, contents,
                     fn_output_signature=tf.float32)
  return tf.cast(images, _dtype())


def maybe_download_and_extract():
  """Gets the data into --data_dir (cifar10_input.maybe_download_and_extract).

  Raises:
    cifar10_input.DataError: the download or the archive failed.
  """
  cifar10_input.maybe_download_and_extract(
      flag('data_dir'), flag('data_url'), flag('data_md5'))


def loss(logits, labels):
  """Mean cross entropy plus the weight decay terms, in float32.

  Args:
    logits: Logits from inference().
    labels: Labels from distorted_inputs() or inputs(), [batch_size].

  Returns:
    The total loss, 'total_loss'.
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
  """Summaries of every loss term and the total, raw and moving-averaged.

  Returns:
    The op that updates the moving averages of the losses.
  """
  # Compute the moving average of all individual losses and the total loss.
  loss_averages = tf1.train.ExponentialMovingAverage(0.9, name='avg')
  losses = tf1.get_collection('losses')
  loss_averages_op = loss_averages.apply(losses + [total_loss])

  # The raw value as '<name> (raw)', the moving average as the plain name.
  for l in losses + [total_loss]:
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
  lr = tf1.train.exponential_decay(
      flag('initial_learning_rate'), global_step, decay_steps,
      LEARNING_RATE_DECAY_FACTOR, staircase=True)
  scalar_summary('learning_rate', lr)
  return lr


def optimizer(lr):
  """The tutorial's gradient descent at lr; with --use_fp16, loss scaling.

  Float16 gradients of small values flush to zero: the loss is multiplied
  by the loss scale before the gradients are taken and they are divided by
  it after. A dynamic scale halves on an overflow (and that step is
  skipped) and doubles after 2000 good steps.
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
  """The variables' moving averages (eval's weights), warmed up by step."""
  return tf1.train.ExponentialMovingAverage(MOVING_AVERAGE_DECAY, global_step)


def apply_gradients(opt, grads, global_step, average=True):
  """Applies (gradient, variable) pairs with opt, then, if average (the
  distributed trainer's optimizer does it itself), updates the variables'
  moving averages.

  Returns:
    train_op: op for one training step; it increments global_step.
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
  """One step of gradient descent, then the variables' moving averages.

  Args:
    total_loss: Total loss from loss().
    global_step: the global step, incremented by each step.

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
