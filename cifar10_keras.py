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
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import cifar10
import tensorflow as tf

layers = tf.keras.layers

# cifar10.py's weight decay of the two fully connected layers.
WEIGHT_DECAY = 0.004


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
