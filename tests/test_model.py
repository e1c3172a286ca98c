"""The model: parameters, shapes, placement, initial loss, training op."""

import math

import numpy as np
import pytest
import tensorflow as tf

import cifar10
from machinery import options
from machinery import recipe as recipes

tf1 = tf.compat.v1

EXPECTED_SHAPES = {
    'conv1/weights': [5, 5, 3, 64], 'conv1/biases': [64],
    'conv2/weights': [5, 5, 64, 64], 'conv2/biases': [64],
    'local3/weights': [2304, 384], 'local3/biases': [384],
    'local4/weights': [384, 192], 'local4/biases': [192],
    'softmax_linear/weights': [192, 10], 'softmax_linear/biases': [10],
}


def _random_batch(batch_size, seed=0):
  rng = np.random.RandomState(seed)
  images = rng.normal(size=(batch_size, 24, 24, 3)).astype(np.float32)
  labels = rng.randint(0, 10, size=batch_size).astype(np.int32)
  return tf.constant(images), tf.constant(labels)


def test_parameters_shapes_and_placement():
  with tf.Graph().as_default():
    images, _ = _random_batch(7)
    logits = cifar10.inference(images)
    assert logits.shape.as_list() == [7, 10]
    variables = tf1.trainable_variables()
    shapes = {v.op.name: v.shape.as_list() for v in variables}
    assert shapes == EXPECTED_SHAPES
    assert sum(np.prod(s) for s in shapes.values()) == 1068298
    for v in variables:
      assert v.device.lower().endswith('/device:cpu:0'), v.device


def test_initial_loss_is_ln10_plus_weight_decay():
  with tf.Graph().as_default():
    tf1.set_random_seed(1)
    images, labels = _random_batch(128)
    total_loss = cifar10.loss(cifar10.inference(images), labels)
    graph = tf1.get_default_graph()
    cross_entropy = graph.get_tensor_by_name('cross_entropy:0')
    decay = [graph.get_tensor_by_name('local3/weight_loss:0'),
             graph.get_tensor_by_name('local4/weight_loss:0')]
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      total, ce, wd = sess.run([total_loss, cross_entropy, decay])
  assert ce == pytest.approx(math.log(10), abs=0.02)
  assert total == pytest.approx(ce + sum(wd), rel=1e-6)
  assert total == pytest.approx(4.68, abs=0.05)


def test_train_step_applies_gradient_then_moving_average():
  with tf.Graph().as_default():
    images, labels = _random_batch(16)
    global_step = tf1.train.get_or_create_global_step()
    total_loss = cifar10.loss(cifar10.inference(images), labels)
    train_op = cifar10.train(total_loss, global_step)
    var = [v for v in tf1.trainable_variables()
           if v.op.name == 'local4/weights'][0]
    grad = tf.gradients(total_loss, var)[0]
    shadow = [v for v in tf1.global_variables()
              if v.op.name == 'local4/weights/ExponentialMovingAverage'][0]
    assert shadow.device.lower().endswith('/device:cpu:0')
    summaries = tf1.get_collection(tf1.GraphKeys.SUMMARIES)
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      before, g = sess.run([var, grad])
      sess.run(train_op)
      after, averaged, step = sess.run([var, shadow, global_step])
      tags = set()
      for s in sess.run(summaries):
        tags.update(v.tag for v in tf1.Summary.FromString(s).value)
  assert step == 1
  np.testing.assert_allclose(after, before - 0.1 * g, rtol=1e-5, atol=1e-7)
  # num_updates=1 after the step: decay = min(0.9999, 2/11). The average
  # moves towards the value written by the gradient step, not the old one.
  decay = 2.0 / 11.0
  np.testing.assert_allclose(averaged, decay * before + (1 - decay) * after,
                             rtol=1e-5, atol=1e-7)
  for tag in ['learning_rate', 'total_loss', 'total_loss (raw)',
              'cross_entropy', 'conv1/sparsity', 'conv1/activations',
              'local3/weights', 'local3/weights/gradients']:
    assert tag in tags


def test_decay_schedule_counts_examples_per_step():
  with tf.Graph().as_default():
    global_step = tf1.train.get_or_create_global_step()
    one = cifar10.learning_rate(global_step, 128)
    four = cifar10.learning_rate(global_step, 4 * 128)
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      # 50000/128*350 = 136718 steps per decay at 128 examples per step.
      sess.run(tf1.assign(global_step, 136718 // 4))
      assert sess.run([one, four]) == pytest.approx([0.1, 0.01])
      sess.run(tf1.assign(global_step, 136718))
      assert sess.run(one) == pytest.approx(0.01)


def test_fp16_is_mixed_precision_float32_variables_float16_compute():
  opts = options.DEFAULT._replace(use_fp16=True)
  with tf.Graph().as_default():
    images, labels = _random_batch(8)
    total_loss = cifar10.loss(
        cifar10.inference(tf.cast(images, tf.float16), opts), labels)
    global_step = tf1.train.get_or_create_global_step()
    cifar10.train(total_loss, global_step, 8, recipes.TUTORIAL, opts)
    graph = tf1.get_default_graph()
    assert all(v.dtype.base_dtype == tf.float32
               for v in tf1.trainable_variables())
    convs = [op for op in graph.get_operations() if op.type == 'Conv2D']
    assert len(convs) == 2
    assert all(op.inputs[0].dtype == op.inputs[1].dtype == tf.float16
               for op in convs)
    assert total_loss.dtype == tf.float32
    # The dynamic loss scale: a variable, starting at 2**15.
    scales = [v for v in tf1.global_variables()
              if v.op.name.endswith('current_loss_scale')]
    assert len(scales) == 1
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      assert sess.run(scales[0]) == 2.0 ** 15
