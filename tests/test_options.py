"""The options for speed on CPU: same maths, and 50 steps of falling loss.

--use_bf16 and --use_fp16 (mixed precision), --data_format, --xla and the
multi-GPU trainer's --variable_update=replicated.
"""

import math

from absl.testing import flagsaver
import numpy as np
import pytest
import tensorflow as tf

import cifar10
import cifar10_multi_gpu_train as multi

tf1 = tf.compat.v1


@pytest.fixture(scope='module')
def real_batches(real_data_dir):
  """Four fixed batches of 8 real test images, cropped as eval crops them."""
  with flagsaver.flagsaver(data_dir=real_data_dir, batch_size=32), \
      tf.Graph().as_default():
    images, labels = cifar10.inputs(eval_data=True)
    with tf1.Session() as sess:
      images, labels = sess.run([images, labels])
  return [(images[i:i + 8], labels[i:i + 8]) for i in range(0, 32, 8)]


def _assert_finite_and_falling(losses):
  assert len(losses) == 50
  assert all(math.isfinite(l) for l in losses), losses
  assert np.mean(losses[-10:]) < np.mean(losses[:10]) - 0.3, losses


def _single_tower_losses(images, labels, steps=50, **flags):
  """Losses of steps training steps of cifar10.train on one fixed batch."""
  with flagsaver.flagsaver(batch_size=len(labels), **flags), \
      tf.Graph().as_default():
    global_step = tf1.train.get_or_create_global_step()
    total_loss = cifar10.loss(
        cifar10.inference(tf.cast(images, cifar10._dtype())), labels)
    train_op = cifar10.train(total_loss, global_step)
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      return [sess.run([train_op, total_loss])[1] for _ in range(steps)]


@pytest.mark.parametrize('flags', [
    {'data_format': 'NHWC'},
    {'data_format': 'NCHW'},
    {'xla': True},
    {'use_bf16': True},
    # Float16 convolutions are slow on CPUs: a small batch.
    {'use_fp16': True},
    {'use_fp16': True, 'loss_scale': '128'},
], ids=lambda f: ','.join('%s=%s' % kv for kv in sorted(f.items())))
def test_option_trains_50_steps_with_finite_falling_loss(real_batches, flags):
  images, labels = real_batches[0]
  if flags.get('use_fp16'):
    images, labels = images[:2], labels[:2]
  _assert_finite_and_falling(_single_tower_losses(images, labels, **flags))


def test_bf16_logits_are_close_to_float32_logits_of_the_same_weights(
    real_batches):
  images, _ = real_batches[0]
  with tf.Graph().as_default():
    float32 = cifar10.inference(tf.constant(images))
    with flagsaver.flagsaver(use_bf16=True), \
        tf1.variable_scope(tf1.get_variable_scope(), reuse=True):
      bfloat16 = cifar10.inference(tf.constant(images, tf.bfloat16))
    assert bfloat16.dtype == tf.bfloat16
    # The same 10 float32 variables serve both.
    assert len(tf1.trainable_variables()) == 10
    assert all(v.dtype.base_dtype == tf.float32
               for v in tf1.global_variables())
    convs = [op for op in tf1.get_default_graph().get_operations()
             if op.type == 'Conv2D']
    assert sorted(op.inputs[1].dtype.name for op in convs) == [
        'bfloat16', 'bfloat16', 'float32', 'float32']
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      a, b = sess.run([float32, tf.cast(bfloat16, tf.float32)])
  # bfloat16 keeps 8 bits of mantissa: logits agree to about 1%.
  assert np.abs(a - b).max() < 0.02 * np.abs(a).max() + 1e-3
  assert not np.array_equal(a, b)


def test_bf16_trains_two_towers_with_finite_falling_loss(real_batches):
  with flagsaver.flagsaver(batch_size=8, use_bf16=True), \
      tf.Graph().as_default():
    graph, config = _multi_graph(real_batches[:2], 'parameter_server')
    assert all(v.dtype.base_dtype in (tf.float32, tf.int64)
               for v in tf1.global_variables())
    with tf1.Session(config=config) as sess:
      sess.run(tf1.global_variables_initializer())
      losses = [sess.run([graph.train_op, graph.loss])[1] for _ in range(50)]
  _assert_finite_and_falling(losses)


def test_nchw_computes_the_same_logits_as_nhwc(real_batches):
  images, _ = real_batches[0]
  with tf.Graph().as_default():
    with flagsaver.flagsaver(data_format='NHWC'):
      nhwc = cifar10.inference(tf.constant(images))
    with flagsaver.flagsaver(data_format='NCHW'), \
        tf1.variable_scope(tf1.get_variable_scope(), reuse=True):
      nchw = cifar10.inference(tf.constant(images))
    # The same 10 variables serve both: checkpoints are interchangeable.
    assert len(tf1.trainable_variables()) == 10
    graph = tf1.get_default_graph()
    formats = {op.get_attr('data_format') for op in graph.get_operations()
               if op.type == 'Conv2D'}
    assert formats == {b'NHWC', b'NCHW'}
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      a, b = sess.run([nhwc, nchw])
  np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_auto_data_format_is_nhwc_without_gpu():
  assert not tf.config.list_physical_devices('GPU')
  assert cifar10.data_format() == 'NHWC'


def test_xla_marks_model_and_gradients_for_compilation(real_batches):
  images, labels = real_batches[0]
  with flagsaver.flagsaver(xla=True, batch_size=8), tf.Graph().as_default():
    total_loss = cifar10.loss(cifar10.inference(tf.constant(images)),
                              tf.constant(labels))
    cifar10.train(total_loss, tf1.train.get_or_create_global_step())
    graph = tf1.get_default_graph()

    def compiled(op_type):
      ops = [op for op in graph.get_operations() if op.type == op_type]
      assert ops, op_type
      return all(op.get_attr('_XlaCompile') for op in ops)
    assert compiled('Conv2D')
    assert compiled('Conv2DBackpropFilter')
    assert compiled('MatMul')


def _multi_graph(batches, variable_update):
  devices, config = multi.tower_devices(2, virtual_cpus=True)
  with tf.device('/cpu:0'):
    graph = multi.build_train_op(
        [(tf.cast(i, cifar10._dtype()), tf.constant(l)) for i, l in batches],
        devices, variable_update)
  return graph, config


def test_replicated_equals_parameter_server_after_one_step(real_batches):
  batches = real_batches[:2]
  with flagsaver.flagsaver(batch_size=8), tf.Graph().as_default():
    graph, config = _multi_graph(batches, 'parameter_server')
    with tf1.Session(config=config) as sess:
      sess.run(tf1.global_variables_initializer())
      initial = {v.op.name: sess.run(v) for v in tf1.global_variables()}
      sess.run(graph.train_op)
      expected = {v.op.name: sess.run(v) for v in tf1.global_variables()}

  with flagsaver.flagsaver(batch_size=8), tf.Graph().as_default():
    graph, config = _multi_graph(batches, 'replicated')
    variables = tf1.global_variables()
    replicas = tf1.local_variables()
    # Same saved variables as the default; the copies are tower 1's.
    assert sorted(v.op.name for v in variables) == sorted(initial)
    assert sorted(v.op.name for v in replicas) == sorted(
        'tower_1/' + v.op.name for v in tf1.trainable_variables())
    assert all(v.device.lower().endswith('cpu:1') for v in replicas)
    with tf1.Session(config=config) as sess:
      sess.run(tf1.global_variables_initializer())
      for v in variables:
        v.load(initial[v.op.name], sess)
      sess.run(graph.local_init_op)
      sess.run(graph.train_op)
      got = {v.op.name: sess.run(v) for v in variables + replicas}
  assert got['global_step'] == expected['global_step'] == 1
  assert not np.array_equal(expected['conv1/weights'],
                            initial['conv1/weights'])
  for name, value in expected.items():
    np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-7,
                               err_msg=name)
    if 'tower_1/' + name in got:
      np.testing.assert_array_equal(got['tower_1/' + name], got[name])


def test_replicated_trains_50_steps_with_finite_falling_loss(real_batches):
  with flagsaver.flagsaver(batch_size=8), tf.Graph().as_default():
    graph, config = _multi_graph(real_batches[:2], 'replicated')
    with tf1.Session(config=config) as sess:
      sess.run(tf1.global_variables_initializer())
      sess.run(graph.local_init_op)
      losses = [sess.run([graph.train_op, graph.loss])[1] for _ in range(50)]
  _assert_finite_and_falling(losses)
