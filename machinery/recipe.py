"""Defines how the model is trained: the learning rate's schedule and the
optimizer, as flags and as one value the trainers hand to the model.

The tutorial's recipe is plain gradient descent at 0.1, divided by 10 every
350 epochs. The flags below keep it by default and offer what large
batches (many towers) need:

  --optimizer=sgd|momentum|lars   gradient descent; with momentum (and
                                  --nesterov); or LARS (machinery/lars.py)
  --lr_schedule=tutorial|cosine|linear
                                  the staircase, or a decay to zero at
                                  --train_epochs, where the trainer stops
  --learning_rate_scaling=linear  the rate times the examples a step
                                  takes over 128 (Goyal et al., 2017)
  --warmup_epochs=E               from --initial_learning_rate up to that
                                  rate over the first E epochs
  --conv_weight_decay=W           weight decay on the convolutions too
                                  (the tutorial decays local3 and local4)
  --fc_weight_decay=W             local3's and local4's weight decay
                                  (the tutorial's: 0.004)
  --label_smoothing=S             1 - S on each label, S spread over all
                                  ten classes
  --dropout=R                     drop a share R of local3's and local4's
                                  outputs while training
  --cutout=P                      blank a P x P square of each training
                                  image (the input pipeline's)
  --mixup=A                       blend the training images in pairs, and
                                  their labels, by shares drawn from
                                  Beta(A, A) (the input pipeline's)
  --moving_average_decay=D        the decay of the weights' moving
                                  averages, which the evaluator measures

A script reads them once, from_flags(), and passes the Recipe down:

  recipe = recipe.from_flags()
  train_op = cifar10.train(loss, global_step, batch_size, recipe)

cifar10.learning_rate and cifar10.optimizer build the tutorial's schedule
and gradient descent themselves, and the rest of a recipe with the
functions at the end of this module.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import collections
import math

from machinery import errors
from machinery import lars
import tensorflow as tf

tf1 = tf.compat.v1
flags = tf1.flags
FLAGS = flags.FLAGS

# Training examples in an epoch (as cifar10_input.py counts them).
EXAMPLES_PER_EPOCH = 50000
# The side of the images the model trains on (cifar10_input.IMAGE_SIZE):
# the largest square --cutout can blank.
IMAGE_SIZE = 24
TUTORIAL_LEARNING_RATE = 0.1  # The tutorial's rate, --initial_learning_rate.
TUTORIAL_BATCH_SIZE = 128  # The examples of a step it was set for.
# The decay of the weights' moving averages. The step caps it at
# (1 + step) / (10 + step), so they span about the last 3,500 steps at
# step 31,250 and the full 10,000 from step 90,000 on.
TUTORIAL_MOVING_AVERAGE_DECAY = 0.9999
DEFAULT_MOMENTUM = 0.9
# The weight decay of the fully connected layers, local3 and local4.
TUTORIAL_FC_WEIGHT_DECAY = 0.004
# LARS's trust coefficient, eta, as You et al. (2017) trained with it.
DEFAULT_TRUST_COEFFICIENT = 0.001

OPTIMIZERS = ('sgd', 'momentum', 'lars')
SCHEDULES = ('tutorial', 'cosine', 'linear')

flags.DEFINE_float('initial_learning_rate', TUTORIAL_LEARNING_RATE,
                   'Initial learning rate of the decay schedule.')
flags.DEFINE_enum('learning_rate_scaling', 'none', ['none', 'linear'],
                  'none: --initial_learning_rate, however many examples a '
                  'step takes (the tutorial). linear: times the examples a '
                  'step takes over all towers and workers, over 128.')
flags.DEFINE_float('warmup_epochs', 0.0,
                   'Epochs over which the learning rate climbs linearly '
                   'from --initial_learning_rate to its scaled value; 0: '
                   'none.', lower_bound=0.0)
flags.DEFINE_enum('lr_schedule', 'tutorial', list(SCHEDULES),
                  'tutorial: divide the rate by 10 every 350 epochs. cosine, '
                  'linear: after the warm-up, decay it to zero at '
                  '--train_epochs, along a half cosine or a straight line.')
flags.DEFINE_float('train_epochs', None,
                   'Epochs to train for: the trainer stops there (or at '
                   '--max_steps, whichever comes first), and the cosine and '
                   'linear schedules reach zero there. None: no budget.')
flags.DEFINE_enum('optimizer', 'sgd', list(OPTIMIZERS),
                  'sgd: gradient descent (the tutorial). momentum: with '
                  'momentum (--momentum, --nesterov). lars: momentum with '
                  'layer-wise rate scaling (LARS, You et al. 2017; '
                  '--lars_trust_coefficient).')
flags.DEFINE_float('momentum', DEFAULT_MOMENTUM,
                   'The momentum of --optimizer=momentum and lars.')
flags.DEFINE_boolean('nesterov', False,
                     'Nesterov\'s momentum for --optimizer=momentum and lars.')
flags.DEFINE_float('lars_trust_coefficient', DEFAULT_TRUST_COEFFICIENT,
                   'LARS: each layer\'s rate is the learning rate times this '
                   'times |weights| / |gradient|.')
flags.DEFINE_float('conv_weight_decay', 0.0,
                   'Weight decay of the convolutions\' kernels, as local3 '
                   'and local4 have theirs (0.004): the loss adds this '
                   'times half their squared norm. 0: none (the tutorial).')
flags.DEFINE_float('fc_weight_decay', TUTORIAL_FC_WEIGHT_DECAY,
                   'Weight decay of the fully connected layers\' weights '
                   '(local3 and local4, 90% of the model\'s weights): the '
                   'loss adds this times half their squared norm. 0: none.')
flags.DEFINE_float('moving_average_decay', TUTORIAL_MOVING_AVERAGE_DECAY,
                   'Decay of the moving averages of the weights, which '
                   'cifar10_eval.py evaluates: they average about the last '
                   '1 / (1 - this) steps (fewer early on: the step caps '
                   'the decay). With a rate that decays to zero, '
                   'a shorter average keeps up with the last, best weights.')
flags.DEFINE_float('label_smoothing', 0.0,
                   'Train on labels smoothed: 1 - this on the right class, '
                   'this spread evenly over all ten. 0: none (the '
                   'tutorial).')
flags.DEFINE_float('dropout', 0.0,
                   'While training, drop this share of the outputs of '
                   'local3 and local4 (the fully connected layers, which '
                   'hold 90% of the weights), scaling the rest up to keep '
                   'their sum (Srivastava et al. 2014; AlexNet dropped half '
                   'of its own). The evaluator keeps them all. 0: none (the '
                   'tutorial).')
flags.DEFINE_integer('cutout', 0,
                     'Blank a square of this side, in pixels, in each '
                     'distorted 24x24 training image, centred on a random '
                     'pixel (Cutout, DeVries and Taylor 2017). The evaluator '
                     'sees whole images. 0: none (the tutorial).')
flags.DEFINE_float('mixup', 0.0,
                   'Train on blends of two images (mixup, Zhang et al. '
                   '2018): each distorted training image keeps a share of '
                   'itself drawn from Beta(this, this) and takes the rest '
                   'from another of its batch, and its label is the same '
                   'blend of the two labels. The evaluator sees whole '
                   'images. 0: none (the tutorial).')


class Recipe(collections.namedtuple('Recipe', [
    'initial_learning_rate', 'learning_rate_scaling', 'warmup_epochs',
    'lr_schedule', 'train_epochs', 'optimizer', 'momentum', 'nesterov',
    'trust_coefficient', 'conv_weight_decay', 'label_smoothing',
    'moving_average_decay', 'dropout', 'cutout', 'fc_weight_decay',
    'mixup'])):
  """How the model trains: each field one of the flags above. The defaults
  are the tutorial's (TUTORIAL)."""

  def budget_steps(self, examples_per_step):
    """Returns the step at which --train_epochs ends, or None without one."""
    if self.train_epochs is None:
      return None
    return int(math.ceil(self.train_epochs * EXAMPLES_PER_EPOCH /
                         examples_per_step))

  def scaled_rate(self, examples_per_step):
    """Returns the rate after the warm-up: --initial_learning_rate, with
    --learning_rate_scaling=linear times examples_per_step / 128 (the
    linear scaling rule of Goyal et al., 2017, for N towers training on N
    times the batch)."""
    if self.learning_rate_scaling != 'linear':
      return self.initial_learning_rate
    return self.initial_learning_rate * examples_per_step / TUTORIAL_BATCH_SIZE

  def warmup_steps(self, examples_per_step):
    """Returns the steps of --warmup_epochs."""
    return int(self.warmup_epochs * EXAMPLES_PER_EPOCH / examples_per_step)

  def last_step(self, max_steps, examples_per_step):
    """Returns the step training stops at: max_steps, or the end of
    --train_epochs if it comes first."""
    budget = self.budget_steps(examples_per_step)
    return max_steps if budget is None else min(max_steps, budget)


TUTORIAL = Recipe(
    initial_learning_rate=TUTORIAL_LEARNING_RATE, learning_rate_scaling='none',
    warmup_epochs=0.0, lr_schedule='tutorial', train_epochs=None,
    optimizer='sgd', momentum=DEFAULT_MOMENTUM, nesterov=False,
    trust_coefficient=DEFAULT_TRUST_COEFFICIENT, conv_weight_decay=0.0,
    label_smoothing=0.0, moving_average_decay=TUTORIAL_MOVING_AVERAGE_DECAY,
    dropout=0.0, cutout=0, fc_weight_decay=TUTORIAL_FC_WEIGHT_DECAY,
    mixup=0.0)


def check(recipe):
  """Returns recipe if it can train, else raises errors.UsageError naming
  the flag to change."""
  if recipe.train_epochs is not None and recipe.train_epochs <= 0:
    raise errors.UsageError('--train_epochs=%g: give a number of epochs '
                            'above 0.' % recipe.train_epochs)
  if recipe.lr_schedule != 'tutorial' and recipe.train_epochs is None:
    raise errors.UsageError(
        '--lr_schedule=%s decays the rate to zero at --train_epochs: give '
        '--train_epochs.' % recipe.lr_schedule)
  if (recipe.train_epochs is not None and
      recipe.train_epochs <= recipe.warmup_epochs):
    raise errors.UsageError(
        'The schedule would end at --train_epochs=%g before its warm-up '
        'does (--warmup_epochs=%g): give more --train_epochs or a shorter '
        'warm-up.' % (recipe.train_epochs, recipe.warmup_epochs))
  if not 0 <= recipe.momentum < 1:
    raise errors.UsageError('--momentum=%g: give a momentum from 0 up to, '
                            'not including, 1.' % recipe.momentum)
  if recipe.trust_coefficient <= 0:
    raise errors.UsageError('--lars_trust_coefficient=%g: give a number '
                            'above 0.' % recipe.trust_coefficient)
  for decay in ('conv_weight_decay', 'fc_weight_decay'):
    if not 0 <= getattr(recipe, decay) < 1:
      raise errors.UsageError('--%s=%g: give a factor from 0 (none) up to, '
                              'not including, 1.'
                              % (decay, getattr(recipe, decay)))
  if not 0 < recipe.moving_average_decay < 1:
    raise errors.UsageError('--moving_average_decay=%g: give a decay above 0 '
                            'and below 1.' % recipe.moving_average_decay)
  if not 0 <= recipe.label_smoothing < 1:
    raise errors.UsageError('--label_smoothing=%g: give a share from 0 '
                            '(none) up to, not including, 1.'
                            % recipe.label_smoothing)
  if not 0 <= recipe.dropout < 1:
    raise errors.UsageError('--dropout=%g: give a share from 0 (none) up to, '
                            'not including, 1.' % recipe.dropout)
  if not 0 <= recipe.cutout <= IMAGE_SIZE:
    raise errors.UsageError('--cutout=%d: give a side in pixels from 0 (none) '
                            'to %d.' % (recipe.cutout, IMAGE_SIZE))
  if not 0 <= recipe.mixup < float('inf'):
    raise errors.UsageError('--mixup=%g: give the alpha of Beta(alpha, '
                            'alpha) above 0, or 0 (none).' % recipe.mixup)
  return recipe


def from_flags():
  """Returns the Recipe the command line asks for (check()ed)."""
  return check(Recipe(
      initial_learning_rate=FLAGS.initial_learning_rate,
      learning_rate_scaling=FLAGS.learning_rate_scaling,
      warmup_epochs=FLAGS.warmup_epochs, lr_schedule=FLAGS.lr_schedule,
      train_epochs=FLAGS.train_epochs, optimizer=FLAGS.optimizer,
      momentum=FLAGS.momentum, nesterov=FLAGS.nesterov,
      trust_coefficient=FLAGS.lars_trust_coefficient,
      conv_weight_decay=FLAGS.conv_weight_decay,
      label_smoothing=FLAGS.label_smoothing,
      moving_average_decay=FLAGS.moving_average_decay,
      dropout=FLAGS.dropout, cutout=FLAGS.cutout,
      fc_weight_decay=FLAGS.fc_weight_decay, mixup=FLAGS.mixup))


def decay_to_zero(step, examples_per_step, recipe):
  """Returns the rate at step of --lr_schedule=cosine or linear: from the
  scaled rate at the end of the warm-up down to 0 at --train_epochs,
  along a half cosine or a straight line."""
  warmup_steps = recipe.warmup_steps(examples_per_step)
  after_warmup = tf.maximum(step - warmup_steps, 0)
  decay_steps = recipe.budget_steps(examples_per_step) - warmup_steps
  scaled = recipe.scaled_rate(examples_per_step)
  if recipe.lr_schedule == 'cosine':
    return tf1.train.cosine_decay(scaled, after_warmup, decay_steps)
  return tf1.train.polynomial_decay(scaled, after_warmup, decay_steps,
                                    end_learning_rate=0.0, power=1.0)


def warm_up(lr, step, examples_per_step, recipe):
  """Returns the rate at step with --warmup_epochs=E: climbing linearly from
  --initial_learning_rate to the scaled rate over the first E epochs, lr
  after them (lr itself without a warm-up)."""
  warmup_steps = recipe.warmup_steps(examples_per_step)
  if not warmup_steps:
    return lr
  initial = recipe.initial_learning_rate
  scaled = recipe.scaled_rate(examples_per_step)
  climbed = tf.cast(step, tf.float32) / warmup_steps
  return tf.where(step < warmup_steps, initial + (scaled - initial) * climbed,
                  lr)


def momentum_optimizer(lr, recipe):
  """Makes --optimizer=momentum's optimizer at rate lr (--momentum,
  --nesterov), or LARS's (machinery/lars.py)."""
  if recipe.optimizer == 'momentum':
    return tf1.train.MomentumOptimizer(lr, recipe.momentum,
                                       use_nesterov=recipe.nesterov)
  return lars.LARSOptimizer(lr, recipe.momentum, recipe.trust_coefficient,
                            use_nesterov=recipe.nesterov)
