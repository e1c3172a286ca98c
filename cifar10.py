"""Builds the CIFAR-10 network.

Summary of available functions:

 # Compute input images and labels for training. If you would like to run
 # evaluations, use inputs() instead.
 inputs, labels = distorted_inputs(data_dir)

 # Compute inference on the model inputs to make a prediction.
 predictions = inference(inputs)

 # Compute the total loss of the prediction with respect to the labels.
 loss = loss(predictions, labels)

 # Create a graph to run one step of training with respect to the loss.
 train_op = train(loss, global_step)

The data comes from cifar10_input.py. The functions take what they need
as arguments, the tutorial's values by default, and read no flag, so that
they run as they are in a notebook: `import cifar10` builds the scripts'
graph there. The scripts read the flags defined here (and the recipe's,
machinery/recipe.py, and the options for speed, machinery/options.py)
once, in their main, and pass them down.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import cifar10_input
from machinery import download
from machinery import lrn
from machinery import options
from machinery import recipe as recipes
from machinery import summaries
import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
flags = tf1.flags

# The graph TF1 builds, wherever the model is built (a script, a notebook, a
# test): a tf.cond is Switch and Merge ops where it stands, not a function
# of its own in the graph's library (TensorBoard would draw dozens of them
# beside the model, and push the towers aside among them).
tf1.disable_control_flow_v2()

# Global constants describing the CIFAR-10 data set.
IMAGE_SIZE = cifar10_input.IMAGE_SIZE
NUM_CLASSES = cifar10_input.NUM_CLASSES
NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN = cifar10_input.NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN
NUM_EXAMPLES_PER_EPOCH_FOR_EVAL = cifar10_input.NUM_EXAMPLES_PER_EPOCH_FOR_EVAL
NUM_EXAMPLES_HELD_OUT = cifar10_input.NUM_EXAMPLES_HELD_OUT
buffered_bytes = cifar10_input.buffered_bytes  # What the input holds.

# Constants describing the training process.
# Decay of the variables' moving averages (--moving_average_decay): 0.9999.
MOVING_AVERAGE_DECAY = recipes.TUTORIAL_MOVING_AVERAGE_DECAY
NUM_EPOCHS_PER_DECAY = 350.0      # Epochs between learning-rate decays.
LEARNING_RATE_DECAY_FACTOR = 0.1  # What each decay multiplies it by.
# The tutorial's INITIAL_LEARNING_RATE, 0.1, is the default of the recipe's
# --initial_learning_rate (machinery/recipe.py).
# Weight decay of local3's and local4's weights (--fc_weight_decay): 0.004.
FC_WEIGHT_DECAY = recipes.TUTORIAL_FC_WEIGHT_DECAY

# The multi-GPU trainer builds tower i in the name scope 'tower_i', so that
# each tower's ops have names of their own; summary tags leave it out.
TOWER_NAME = 'tower'

# Basic model parameters.
BATCH_SIZE = 128  # The examples of a step of the tutorial.
DATA_DIR = '/tmp/cifar10_data'
flags.DEFINE_integer('batch_size', BATCH_SIZE,
                     'Number of images to process in a batch.', lower_bound=1)
flags.DEFINE_string('data_dir', DATA_DIR,
                    'Path to the CIFAR-10 data directory.')
flags.DEFINE_string('data_url', download.DATA_URL,
                    'Where to get the CIFAR-10 binary archive when data_dir '
                    'lacks it: an http(s):// or file:// URL.')
flags.DEFINE_string('data_md5', '',
                    'md5 the archive must have; empty: the official md5 for '
                    'the official URL, no check for other URLs.')
flags.DEFINE_boolean('hold_out', False, 'Train without the last 5,000 '
                     'training images, for cifar10_eval.py --eval_data='
                     'held_out: to choose recipes without the test set.')
flags.adopt_module_key_flags(options)
flags.adopt_module_key_flags(recipes)  # The learning rate and the optimizer.


def _activation_summary(x):
  """Summarizes the layer output x: a histogram of its values, and the
  fraction of them that are zero (its sparsity)."""
  # Tag by the layer's name alone: 'conv1', not 'tower_0/conv1/conv1'.
  layer_name = x.op.name.split('/')[-1]
  summaries.histogram_summary(layer_name + '/activations', x)
  summaries.scalar_summary(layer_name + '/sparsity', tf.nn.zero_fraction(x))


def _variable_on_cpu(name, shape, initializer, dtype=tf.float32):
  """Creates (or, in a reusing scope, gets) the variable name of shape,
  kept on /cpu:0, and returns it in dtype, the dtype the model computes in.

  The variable is float32 in every precision, so checkpoints are the same;
  with --use_fp16 or --use_bf16 the model reads it through a cast on its
  own device (mixed precision).
  """
  with tf.device('/cpu:0'):
    var = tf1.get_variable(name, shape, initializer=initializer,
                           dtype=tf.float32)
  return tf.cast(var, dtype)


def _variable_with_weight_decay(name, shape, stddev, wd, dtype=tf.float32):
  """Creates a variable on /cpu:0 from a truncated normal of stddev, with
  weight decay, and returns it in dtype (_variable_on_cpu).

  The weight decay, wd * l2_loss of the variable (in float32), goes into
  the 'losses' collection, which loss() sums; wd None adds none.
  """
  var = _variable_on_cpu(name, shape,
                         tf1.truncated_normal_initializer(stddev=stddev),
                         dtype)
  if wd is not None:
    weight_decay = tf.multiply(tf.nn.l2_loss(tf.cast(var, tf.float32)), wd,
                               name='weight_loss')
    tf1.add_to_collection('losses', weight_decay)
  return var


def distorted_batches(data_dir=DATA_DIR, batch_size=BATCH_SIZE, num_batches=1,
                      opts=options.DEFAULT, hold_out=False, cutout=0, skip=0,
                      mixup=0.0):
  """Constructs num_batches distinct distorted training batches (one per
  tower) from one input pipeline, with hold_out without the last 5,000
  training images, with cutout a square of that side blanked in each,
  after skip examples drawn and passed over, with mixup > 0 each image
  blended with another (cifar10_input.py).

  Returns:
    A list of num_batches (images, labels) pairs: images
    [batch_size, IMAGE_SIZE, IMAGE_SIZE, 3] in opts' dtype, labels
    [batch_size] (with mixup, [batch_size, NUM_CLASSES] shares).
  """
  batches = cifar10_input.distorted_batches(data_dir, batch_size, num_batches,
                                            hold_out, cutout, skip, mixup)
  return [(tf.cast(images, opts.compute_dtype()), labels)
          for images, labels in batches]


def distorted_inputs(data_dir=DATA_DIR, batch_size=BATCH_SIZE,
                     opts=options.DEFAULT, hold_out=False, cutout=0, skip=0,
                     mixup=0.0):
  """Constructs distorted input for CIFAR training (cifar10_input.py), after
  skip examples drawn and passed over; returns images
  [batch_size, 24, 24, 3] in opts' dtype, labels [batch_size] (with
  mixup, [batch_size, NUM_CLASSES] shares)."""
  images, labels = cifar10_input.distorted_inputs(data_dir, batch_size,
                                                  hold_out, cutout, skip,
                                                  mixup)
  return tf.cast(images, opts.compute_dtype()), labels


def inputs(eval_data, data_dir=DATA_DIR, batch_size=BATCH_SIZE,
           opts=options.DEFAULT, held_out=False):
  """Constructs evaluation input, central crops in file order: of the test
  set (eval_data True) or the training set, or with held_out only its last
  5,000 images (those --hold_out leaves out of training).

  Returns:
    images: [batch_size, IMAGE_SIZE, IMAGE_SIZE, 3], in opts' dtype.
    labels: [batch_size].
  """
  images, labels = cifar10_input.inputs(eval_data, data_dir, batch_size,
                                        held_out)
  return tf.cast(images, opts.compute_dtype()), labels


def _max_pool(x, name, data_format):
  """Pools x as the tutorial does: 3x3 windows, stride 2, the maximum."""
  channels_first = data_format == 'NCHW'
  return tf.nn.max_pool2d(
      x, ksize=[1, 1, 3, 3] if channels_first else [1, 3, 3, 1],
      strides=[1, 1, 2, 2] if channels_first else [1, 2, 2, 1],
      padding='SAME', data_format=data_format, name=name)


def inference(images, opts=options.DEFAULT, conv_weight_decay=None,
              dropout=None, fc_weight_decay=FC_WEIGHT_DECAY):
  """Builds the CIFAR-10 model on images (from distorted_inputs() or
  inputs(), NHWC, in opts' dtype), as opts says (precision, layout, XLA),
  the convolutions' kernels decayed by conv_weight_decay and a share
  dropout of local3's and local4's outputs dropped (None: neither, as the
  tutorial's; only a trainer's model drops), local3's and local4's
  weights decayed by fc_weight_decay (0: not); returns the logits,
  [batch_size, NUM_CLASSES]."""
  with opts.compiled():  # With --xla, the model and its gradients go to XLA.
    return _layers(images, opts.data_format(), opts.compute_dtype(),
                   conv_weight_decay or None, dropout or None,
                   fc_weight_decay or None)


def _layers(images, fmt, dtype, conv_wd, dropout, fc_wd):
  """Builds the model's layers on images in layout fmt (NHWC or NCHW, for
  the device it runs on), computing in dtype, the convolutions' kernels
  decayed by conv_wd and the fully connected layers' weights by fc_wd, a
  share dropout of their outputs dropped (None: not); returns the
  logits."""
  # Every variable is made by tf.get_variable(), never tf.Variable(): in a
  # reusing variable scope it finds the variable of that name instead of
  # making a new one, so every tower of the multi-GPU trainer that builds
  # this model trains the same variables. One tower alone needs no sharing.
  if fmt == 'NCHW':
    images = tf.transpose(images, [0, 3, 1, 2])

  # conv1, pool1, norm1 (tf.nn.lrn's function, made fast on CPUs:
  # machinery/lrn.py)
  conv1 = _conv('conv1', images, 3, 0.0, conv_wd, fmt, dtype)
  pool1 = _max_pool(conv1, 'pool1', fmt)
  norm1 = lrn.lrn(pool1, 4, bias=1.0, alpha=0.001 / 9.0, beta=0.75,
                  name='norm1', data_format=fmt)

  # conv2, norm2, pool2
  conv2 = _conv('conv2', norm1, 64, 0.1, conv_wd, fmt, dtype)
  norm2 = lrn.lrn(conv2, 4, bias=1.0, alpha=0.001 / 9.0, beta=0.75,
                  name='norm2', data_format=fmt)
  pool2 = _max_pool(norm2, 'pool2', fmt)
  if fmt == 'NCHW':
    # Flatten in NHWC order, so the weights below mean the same in both
    # layouts and checkpoints are interchangeable.
    pool2 = tf.transpose(pool2, [0, 2, 3, 1])

  # local3, local4 (with --dropout, each drops a share of its outputs)
  local3 = _local('local3', pool2, 384, dtype, fc_wd, dropout)
  local4 = _local('local4', local3, 192, dtype, fc_wd, dropout)

  # softmax_linear: the logits, W x + b, with no softmax: the loss takes
  # them as they are (sparse_softmax_cross_entropy_with_logits applies the
  # softmax itself, faster and more stable than a softmax here).
  with tf1.variable_scope('softmax_linear') as scope:
    weights = _variable_with_weight_decay('weights', [192, NUM_CLASSES],
                                          stddev=1 / 192.0, wd=None,
                                          dtype=dtype)
    biases = _variable_on_cpu('biases', [NUM_CLASSES],
                              tf1.constant_initializer(0.0), dtype)
    softmax_linear = tf.add(tf.matmul(local4, weights), biases,
                            name=scope.name)
    _activation_summary(softmax_linear)

  return softmax_linear


def _conv(name, x, channels, bias, wd, fmt, dtype):
  """Builds the convolution layer name on x (of channels channels): 64 5x5
  kernels (decayed by wd), stride 1, biases from bias, a ReLU; returns its
  output."""
  with tf1.variable_scope(name) as scope:
    kernel = _variable_with_weight_decay('weights', shape=[5, 5, channels, 64],
                                         stddev=5e-2, wd=wd, dtype=dtype)
    conv = tf.nn.conv2d(x, kernel, [1, 1, 1, 1], padding='SAME',
                        data_format=fmt)
    biases = _variable_on_cpu('biases', [64], tf1.constant_initializer(bias),
                              dtype)
    pre_activation = tf.nn.bias_add(conv, biases, data_format=fmt)
    output = tf.nn.relu(pre_activation, name=scope.name)
    _activation_summary(output)
  return output


def _local(name, x, units, dtype, wd, dropout=None):
  """Builds the fully connected layer name on x: units ReLUs, their
  weights decayed by wd (the tutorial's 0.004; None: not), their biases
  from 0.1; returns its output, with a share dropout of it zeroed at
  random and the rest scaled by 1 / (1 - dropout), which keeps its
  expected sum (None: all of it)."""
  with tf1.variable_scope(name) as scope:
    if x.shape.ndims > 2:
      # Each image's 6x6x64 activations as one row of 2304, so that one
      # matmul serves the batch (of any size: the exported model takes any).
      x = tf.reshape(x, [-1, int(np.prod(x.get_shape()[1:]))])
    weights = _variable_with_weight_decay('weights',
                                          shape=[int(x.shape[1]), units],
                                          stddev=0.04, wd=wd, dtype=dtype)
    biases = _variable_on_cpu('biases', [units],
                              tf1.constant_initializer(0.1), dtype)
    output = tf.nn.relu(tf.matmul(x, weights) + biases, name=scope.name)
    _activation_summary(output)
    if dropout:
      output = tf.nn.dropout(output, rate=dropout, name='dropout')
  return output


def loss(logits, labels, label_smoothing=0.0):
  """Adds the mean cross entropy to the weight decay terms, in float32.

  Args:
    logits: Logits from inference().
    labels: Labels from distorted_inputs() or inputs(), [batch_size]; or,
      from distorted_inputs() with mixup, each image's shares of the
      classes, float [batch_size, NUM_CLASSES].
    label_smoothing: the share of each label spread evenly over all the
      classes (--label_smoothing); 0: none, as the tutorial's.

  Returns:
    The total loss, 'total_loss'.
  """
  # Calculate the average cross entropy loss across the batch.
  labels = tf.convert_to_tensor(labels)  # (A tensor, or numpy's labels.)
  logits = tf.cast(logits, tf.float32)
  if labels.dtype.is_floating:  # Shares of the classes (mixup).
    cross_entropy = _soft_cross_entropy(logits, labels, label_smoothing)
  elif label_smoothing:
    cross_entropy = _soft_cross_entropy(
        logits, tf.one_hot(labels, NUM_CLASSES), label_smoothing)
  else:
    cross_entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(labels, tf.int64), logits=logits,
        name='cross_entropy_per_example')
  cross_entropy_mean = tf.reduce_mean(cross_entropy, name='cross_entropy')
  tf1.add_to_collection('losses', cross_entropy_mean)

  # The total loss is defined as the cross entropy loss plus all of the weight
  # decay terms (L2 loss): those of this model, made in the current name
  # scope (in the multi-GPU trainer, a tower's own, not the other towers').
  scope = tf1.get_default_graph().get_name_scope()
  return tf.add_n(tf1.get_collection('losses', scope + '/' if scope else None),
                  name='total_loss')


def _soft_cross_entropy(logits, targets, smoothing):
  """Returns each example's cross entropy against its targets (shares of
  the classes, float [batch, NUM_CLASSES]), smoothed: 1 - smoothing of
  them, plus smoothing / NUM_CLASSES on every class."""
  if smoothing:
    with tf1.name_scope('label_smoothing'):
      targets = targets * (1.0 - smoothing) + smoothing / NUM_CLASSES
  return tf.nn.softmax_cross_entropy_with_logits(
      labels=tf.cast(targets, tf.float32), logits=logits,
      name='cross_entropy_per_example')


def _add_loss_summaries(total_loss):
  """Adds summaries of every loss term and of total_loss (from loss()), raw
  and averaged; returns the op that updates the losses' moving averages."""
  with tf1.name_scope('loss_averages'):
    # Compute the moving average of all individual losses and the total
    # loss.
    loss_averages = tf1.train.ExponentialMovingAverage(0.9, name='avg')
    losses = tf1.get_collection('losses')
    loss_averages_op = loss_averages.apply(losses + [total_loss])

    # The raw value as '<name> (raw)', the moving average as the plain name.
    for l in losses + [total_loss]:
      summaries.scalar_summary(l.op.name + ' (raw)', l)
      summaries.scalar_summary(l.op.name, loss_averages.average(l))

  return loss_averages_op


def learning_rate(global_step, examples_per_step, recipe=recipes.TUTORIAL):
  """Makes the learning rate of each step, as the recipe schedules it.

  The tutorial's (the default recipe): --initial_learning_rate, divided by
  10 every 350 epochs, epochs counted in examples. A recipe may scale the
  rate to the step's examples, warm it up, or decay it to zero at
  --train_epochs instead (machinery/recipe.py).

  Args:
    global_step: the global step tensor.
    examples_per_step: examples a step takes (all towers' and workers').
    recipe: a machinery.recipe.Recipe, the flags' values.

  Returns:
    The learning rate tensor, with a 'learning_rate' summary.
  """
  steps_per_epoch = NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN / examples_per_step
  with tf1.name_scope('learning_rate'):
    step = tf.identity(global_step)  # One read of it, for every use below.
    if recipe.lr_schedule == 'tutorial':
      # Decay the learning rate exponentially based on the number of steps.
      lr = tf1.train.exponential_decay(
          recipe.scaled_rate(examples_per_step), step,
          int(steps_per_epoch * NUM_EPOCHS_PER_DECAY),
          LEARNING_RATE_DECAY_FACTOR, staircase=True)
    else:
      lr = recipes.decay_to_zero(step, examples_per_step, recipe)
    lr = recipes.warm_up(lr, step, examples_per_step, recipe)
    summaries.scalar_summary('learning_rate', lr)
  return lr


def optimizer(lr, recipe=recipes.TUTORIAL, opts=options.DEFAULT):
  """Makes the recipe's optimizer at rate lr: the tutorial's gradient
  descent, or momentum or LARS (machinery/recipe.py); with opts'
  --use_fp16 it scales the loss (Options.scale_loss)."""
  if recipe.optimizer == 'sgd':
    opt = tf1.train.GradientDescentOptimizer(lr)
  else:
    opt = recipes.momentum_optimizer(lr, recipe)
  return opts.scale_loss(opt)


def variable_averages(global_step=None, decay=MOVING_AVERAGE_DECAY):
  """Makes the variables' moving averages (eval's weights), warmed up by
  the step."""
  return tf1.train.ExponentialMovingAverage(decay, global_step)


def averaged_weights():
  """Maps the names in a checkpoint of the trained variables' moving
  averages to the model's variables (in the default graph): restoring
  them gives the model the weights cifar10_eval.py measures."""
  return variable_averages().variables_to_restore()


def variable_summaries(grads):
  """Adds histograms of every trainable variable and of its gradient, from
  the (gradient, variable) pairs grads."""
  for var in tf1.trainable_variables():
    summaries.histogram_summary(var.op.name, var)
  for grad, var in grads:
    if grad is not None and var.trainable:
      summaries.histogram_summary(var.op.name + '/gradients', grad)


def apply_gradients(opt, grads, global_step, decay=MOVING_AVERAGE_DECAY):
  """Applies grads, (gradient, variable) pairs, with the optimizer opt and
  increments global_step, then tracks the variables' moving averages (of
  decay); returns the op of one training step."""
  apply_gradient_op = opt.apply_gradients(grads, global_step=global_step)

  # Add histograms for trainable variables and their gradients.
  variable_summaries(grads)

  # Track the moving averages of all trainable variables, from the values
  # the gradient step has just written.
  with tf.control_dependencies([apply_gradient_op]), tf1.name_scope(
      'moving_averages'):
    variables_averages_op = variable_averages(global_step, decay).apply(
        tf1.trainable_variables())
  return variables_averages_op


def train(total_loss, global_step, batch_size=BATCH_SIZE,
          recipe=recipes.TUTORIAL, opts=options.DEFAULT):
  """Builds one step of gradient descent (or the recipe's optimizer) on
  total_loss, from loss(), then the moving averages.

  Args:
    total_loss: Total loss from loss().
    global_step: the global step, incremented by each step.
    batch_size: the examples the loss is over, for the rate's schedule.
    recipe: a machinery.recipe.Recipe: the learning rate and optimizer.
    opts: the options.Options the model was built with (the loss scale).

  Returns:
    train_op: op for training.
  """
  lr = learning_rate(global_step, batch_size, recipe)

  # Generate moving averages of all losses and associated summaries.
  loss_averages_op = _add_loss_summaries(total_loss)

  # Compute gradients.
  with tf.control_dependencies([loss_averages_op]):
    opt = optimizer(lr, recipe, opts)
    grads = opt.compute_gradients(total_loss)

  # Apply gradients, then the moving averages of the trained variables.
  return apply_gradients(opt, grads, global_step, recipe.moving_average_decay)


def maybe_download_and_extract(data_dir=DATA_DIR, data_url=download.DATA_URL,
                               data_md5=''):
  """Downloads the archive from data_url (an http(s):// or file:// URL) and
  extracts it into data_dir, unless it is there; checks its md5 (data_md5,
  or the official one for the official URL); raises errors.DataError
  (machinery/download.py)."""
  download.maybe_download_and_extract(data_dir, data_url, data_md5)
