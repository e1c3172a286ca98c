"""The CIFAR-10 model of cifar10.py, layer for layer, in Keras.

Read it beside cifar10.inference(): the same layers in the same order,
the same initializers and weight decay, so that benchmark.py can time
this project's graph against the usual Keras way of training the same
model (model.fit, or a tf.function step). Two differences of form, none
of function:

- Keras' l2(w) regularizer is w * sum(x**2), TensorFlow's l2_loss half
  that: a weight decay of 0.004 is l2(0.004 / 2) here.
- LRN has no Keras layer: tf.nn.lrn in a Lambda layer, in float32 (it has
  no bfloat16 kernel on CPUs).

Usage:
  model = cifar10_keras.keras_model()       # or 'mixed_bfloat16'
  model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss=...)

and benchmark.py's Keras rows, the two usual ways to train it, each a
timer of n steps:

  timer, device = fit_timer('float32', data_dir, batch_size=128)
  timer, device = loop_timer('mixed_bfloat16', data_dir, batch_size=128)
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import time

import cifar10
import cifar10_input
from machinery import timing
import tensorflow as tf

layers = tf.keras.layers

# cifar10.py's weight decay of the two fully connected layers (0.004).
WEIGHT_DECAY = cifar10.FC_WEIGHT_DECAY


def _normal(stddev):
  """cifar10.py's initial weights: a truncated normal of stddev."""
  return tf.keras.initializers.TruncatedNormal(stddev=stddev)


def _lrn(policy):
  """cifar10.py's norm1 and norm2: local response normalization."""
  return layers.Lambda(lambda x: tf.cast(tf.nn.lrn(
      tf.cast(x, tf.float32), 4, bias=1.0, alpha=0.001 / 9.0, beta=0.75),
                                         x.dtype), dtype=policy)


def keras_model(policy='float32'):
  """Builds the tutorial's model the usual Keras way.

  Args:
    policy: the Keras dtype policy of every layer: 'float32' or
      'mixed_bfloat16' (float32 variables, bfloat16 compute; the logits
      come out in float32).

  Returns:
    An uncompiled tf.keras.Model taking [batch, 24, 24, 3] images and
    returning the logits, [batch, 10].
  """
  decay = tf.keras.regularizers.l2(WEIGHT_DECAY / 2)
  constant = tf.keras.initializers.Constant
  return tf.keras.Sequential([
      tf.keras.Input((cifar10.IMAGE_SIZE, cifar10.IMAGE_SIZE, 3)),
      # conv1, pool1, norm1
      layers.Conv2D(64, 5, padding='same', activation='relu',
                    kernel_initializer=_normal(5e-2), dtype=policy),
      layers.MaxPool2D(3, 2, padding='same', dtype=policy),
      _lrn(policy),
      # conv2, norm2, pool2
      layers.Conv2D(64, 5, padding='same', activation='relu',
                    kernel_initializer=_normal(5e-2),
                    bias_initializer=constant(0.1), dtype=policy),
      _lrn(policy),
      layers.MaxPool2D(3, 2, padding='same', dtype=policy),
      # local3, local4: fully connected, with weight decay
      layers.Flatten(dtype=policy),
      layers.Dense(384, activation='relu', kernel_initializer=_normal(0.04),
                   bias_initializer=constant(0.1), kernel_regularizer=decay,
                   dtype=policy),
      layers.Dense(192, activation='relu', kernel_initializer=_normal(0.04),
                   bias_initializer=constant(0.1), kernel_regularizer=decay,
                   dtype=policy),
      # softmax_linear: the logits, with no softmax (the loss applies it)
      layers.Dense(cifar10.NUM_CLASSES, kernel_initializer=_normal(1 / 192.0),
                   dtype=policy),
      layers.Activation('linear', dtype='float32'),
  ])


def _compiled_model(policy, learning_rate):
  """The model, its SGD optimizer and its loss: cross entropy from the
  logits (plus the weight decay, which Keras adds itself in fit)."""
  return (keras_model(policy), tf.keras.optimizers.SGD(learning_rate),
          tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def _device():
  """Names where Keras runs its model: the first GPU if there is one."""
  return 'GPU:0' if tf.config.list_logical_devices('GPU') else 'CPU:0'


def fit_timer(policy, data_dir, batch_size, learning_rate=0.1,
              jit_compile='auto'):
  """Times model.fit on the distorted training batches of a tf.data
  pipeline (cifar10_input.distorted_dataset: the same preprocessing).

  Args:
    policy: the Keras dtype policy (keras_model).
    data_dir: where the CIFAR-10 data is.
    batch_size: examples a step.
    learning_rate: SGD's rate.
    jit_compile: compile()'s jit_compile: 'auto', True or False.

  Returns:
    (timer, device): timer(n) runs n + 1 steps in one fit call and returns
    the seconds from the end of its first step to the end of its last, so
    that the call's set-up is not timed.
  """
  model, opt, cross_entropy = _compiled_model(policy, learning_rate)
  model.compile(optimizer=opt, loss=cross_entropy, jit_compile=jit_compile)
  dataset = cifar10_input.distorted_dataset(data_dir, batch_size,
                                            tf.data.AUTOTUNE)
  ends = []

  class Clock(tf.keras.callbacks.Callback):

    def on_train_batch_end(self, batch, logs=None):
      ends.append(time.time())

  def timer(n):
    del ends[:]
    model.fit(dataset, epochs=1, verbose=0, callbacks=[Clock()],
              steps_per_epoch=n + 1)
    return ends[-1] - ends[0]

  return timer, _device()


def loop_timer(policy, data_dir, batch_size, learning_rate=0.1,
               jit_compile='auto'):
  """Times a custom tf.function train step over the same model and
  batches (see fit_timer; jit_compile True compiles the step).

  Returns:
    (timer, device): timer(n) runs n steps and returns the seconds.
  """
  model, opt, cross_entropy = _compiled_model(policy, learning_rate)

  @tf.function(jit_compile=jit_compile is True)
  def train_step(images, labels):
    with tf.GradientTape() as tape:
      logits = model(images, training=True)
      loss = cross_entropy(labels, logits) + tf.add_n(model.losses)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  batches = iter(cifar10_input.distorted_dataset(data_dir, batch_size,
                                                 tf.data.AUTOTUNE))
  return (timing.stepper(lambda: train_step(*next(batches)).numpy()),
          _device())
