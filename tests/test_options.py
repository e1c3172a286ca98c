"""The options for speed on CPU: same maths, and 50 steps of falling loss.

--use_bf16 and --use_fp16 (mixed precision), --data_format, --xla and the
multi-GPU trainer's --variable_update=replicated.
"""

import math
import os

import numpy as np
import pytest
import tensorflow as tf

import cifar10
from conftest import build_towers, error_lines, run_script
from machinery import hardware
from machinery import options
from machinery import recipe as recipes

tf1 = tf.compat.v1


def _opts(**flags):
  """The Options the flags of these names ask for, the rest defaults."""
  fields = {'data_format': 'layout', 'loss_scale': 'loss_scale_value'}
  return options.DEFAULT._replace(
      **{fields.get(name, name): value for name, value in flags.items()})


@pytest.fixture(scope='module')
def real_batches(real_data_dir):
  """Four fixed batches of 8 real test images, cropped as eval crops them."""
  with tf.Graph().as_default():
    images, labels = cifar10.inputs(True, real_data_dir, batch_size=32)
    with tf1.Session() as sess:
      images, labels = sess.run([images, labels])
  return [(images[i:i + 8], labels[i:i + 8]) for i in range(0, 32, 8)]


# The graph seed of the runs that train on one fixed batch.
SEED = 7


def _assert_finite_and_falling(losses):
  # Over graph seeds 1-20 the mean loss of the last 10 steps fell 1.37 to
  # 3.3 below the first 10's, with every option; at a learning rate of 0,
  # not at all.
  assert len(losses) == 50
  assert all(math.isfinite(l) for l in losses), losses
  assert np.mean(losses[-10:]) < np.mean(losses[:10]) - 0.3, losses


def _single_tower_losses(images, labels, steps=50, **flags):
  """Losses of steps training steps of cifar10.train on one fixed batch,
  from the same initial weights each time (a fixed graph seed), and the
  types of the ops its first step ran (the partition graphs)."""
  opts = _opts(**flags)
  with tf.Graph().as_default():
    tf1.set_random_seed(SEED)
    global_step = tf1.train.get_or_create_global_step()
    images = tf.cast(images, opts.compute_dtype())
    total_loss = cifar10.loss(cifar10.inference(images, opts), labels)
    train_op = cifar10.train(total_loss, global_step, len(labels),
                             recipes.TUTORIAL, opts)
    with tf1.Session() as sess:
      sess.run([tf1.global_variables_initializer(),
                tf1.local_variables_initializer()])
      metadata = tf1.RunMetadata()
      losses = [sess.run([train_op, total_loss], options=tf1.RunOptions(
          output_partition_graphs=True), run_metadata=metadata)[1]]
      losses += [sess.run([train_op, total_loss])[1]
                 for _ in range(steps - 1)]
  ran = {node.op for graph in metadata.partition_graphs for node in graph.node}
  return losses, ran


# Channels-first runs on GPUs, and on CPUs where TensorFlow uses oneDNN.
NCHW_HERE = pytest.mark.skipif(
    not hardware.nchw_runs_here(),
    reason='this CPU build of TensorFlow pools NHWC only (no oneDNN), and '
    'there is no GPU')


@pytest.mark.parametrize('flags', [
    {'data_format': 'NHWC'},
    pytest.param({'data_format': 'NCHW'}, marks=NCHW_HERE),
    {'xla': True},
    {'use_bf16': True},
    {'use_fp16': True},
    {'use_fp16': True, 'loss_scale': '128'},
], ids=lambda f: ','.join('%s=%s' % kv for kv in sorted(f.items())))
def test_option_trains_50_steps_with_finite_falling_loss(real_batches, flags):
  images, labels = real_batches[0]
  losses, ran = _single_tower_losses(images, labels, **flags)
  _assert_finite_and_falling(losses)
  # With --xla the step ran compiled clusters; without, none.
  assert ('_XlaRun' in ran) == flags.get('xla', False), sorted(ran)


def test_bf16_logits_are_close_to_float32_logits_of_the_same_weights(
    real_batches):
  images, _ = real_batches[0]
  with tf.Graph().as_default():
    tf1.set_random_seed(SEED)
    float32 = cifar10.inference(tf.constant(images))
    with tf1.variable_scope(tf1.get_variable_scope(), reuse=True):
      bfloat16 = cifar10.inference(tf.constant(images, tf.bfloat16),
                                   _opts(use_bf16=True))
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
      sess.run([tf1.global_variables_initializer(),
                tf1.local_variables_initializer()])
      a, b = sess.run([float32, tf.cast(bfloat16, tf.float32)])
  # bfloat16 keeps 8 bits of mantissa: logits agree to about 1%, and the
  # error is small next to how much the logits differ between images
  # (freshly initialized, they are all close to the biases). Over graph
  # seeds 1-40 the two ratios were 0.006-0.013 and 0.013-0.039.
  error = np.abs(a - b).max()
  assert error < 0.03 * np.abs(a).max(), (error, np.abs(a).max())
  assert error < 0.15 * np.abs(a - a.mean(axis=0)).max()
  assert not np.array_equal(a, b)


def test_bf16_trains_two_towers_with_finite_falling_loss(real_batches,
                                                         cpu_only):
  with tf.Graph().as_default():
    train_op, loss, _, config = _multi_graph(
        real_batches[:2], 'parameter_server', _opts(use_bf16=True))
    assert all(v.dtype.base_dtype in (tf.float32, tf.int64)
               for v in tf1.global_variables())
    with tf1.Session(config=config) as sess:
      sess.run([tf1.global_variables_initializer(),
                tf1.local_variables_initializer()])
      losses = [sess.run([train_op, loss])[1] for _ in range(50)]
  _assert_finite_and_falling(losses)


@NCHW_HERE
def test_nchw_computes_the_same_logits_as_nhwc(real_batches):
  images, _ = real_batches[0]
  with tf.Graph().as_default():
    nhwc = cifar10.inference(tf.constant(images), _opts(data_format='NHWC'))
    with tf1.variable_scope(tf1.get_variable_scope(), reuse=True):
      nchw = cifar10.inference(tf.constant(images),
                               _opts(data_format='NCHW'))
    # The same 10 variables serve both: checkpoints are interchangeable.
    assert len(tf1.trainable_variables()) == 10
    graph = tf1.get_default_graph()
    formats = {op.get_attr('data_format') for op in graph.get_operations()
               if op.type == 'Conv2D'}
    assert formats == {b'NHWC', b'NCHW'}
    with tf1.Session() as sess:
      sess.run([tf1.global_variables_initializer(),
                tf1.local_variables_initializer()])
      a, b = sess.run([nhwc, nchw])
  np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_auto_data_format_is_nhwc_without_gpu(cpu_only):
  assert options.DEFAULT.data_format() == 'NHWC'


def test_auto_data_format_follows_the_device_the_model_is_built_for():
  with tf.Graph().as_default():
    with tf.device('/gpu:1'):
      assert options.DEFAULT.data_format() == 'NCHW'
      # Tensor cores compute float16 and bfloat16 channels last.
      for precision in ('use_fp16', 'use_bf16'):
        assert _opts(**{precision: True}).data_format() == 'NHWC'
    # A tower pinned to a CPU, whether or not a GPU is visible.
    with tf.device('/cpu:0'):
      assert options.DEFAULT.data_format() == 'NHWC'
    with tf.device('/job:worker/task:1/device:GPU:0'):
      assert options.DEFAULT.data_format() == 'NCHW'
    # Portable: channels last, float32, uncompiled, on any device.
    with tf.device('/gpu:0'):
      assert options.PORTABLE.data_format() == 'NHWC'
    assert options.PORTABLE.compute_dtype() == tf.float32
    assert not options.PORTABLE.xla


def test_xla_marks_model_and_gradients_for_compilation(real_batches):
  images, labels = real_batches[0]
  with tf.Graph().as_default():
    opts = _opts(xla=True)
    total_loss = cifar10.loss(cifar10.inference(tf.constant(images), opts),
                              tf.constant(labels))
    cifar10.train(total_loss, tf1.train.get_or_create_global_step(), 8,
                  recipes.TUTORIAL, opts)
    graph = tf1.get_default_graph()

    def compiled(op_type):
      ops = [op for op in graph.get_operations() if op.type == op_type]
      assert ops, op_type
      return all(op.get_attr('_XlaCompile') for op in ops)
    assert compiled('Conv2D')
    assert compiled('Conv2DBackpropFilter')
    assert compiled('MatMul')


def _multi_graph(batches, variable_update, opts=options.DEFAULT):
  """Two towers on /cpu:0 and /cpu:1 on batches.

  Returns:
    (train_op, loss, local init op, session config).
  """
  devices, config = hardware.tower_devices(2, virtual=True)
  assert devices == ['/cpu:0', '/cpu:1']  # See cpu_only.
  tensors = [(tf.cast(i, opts.compute_dtype()), tf.constant(l))
             for i, l in batches]
  train_op, loss, scaffold = build_towers(tensors, devices, variable_update,
                                          opts)
  return (train_op, loss,
          scaffold.local_init_op or tf1.local_variables_initializer(), config)


def test_replicated_equals_parameter_server_after_one_step(real_batches,
                                                          cpu_only):
  batches = real_batches[:2]
  with tf.Graph().as_default():
    train_op, _, _, config = _multi_graph(batches, 'parameter_server')
    with tf1.Session(config=config) as sess:
      sess.run([tf1.global_variables_initializer(),
                tf1.local_variables_initializer()])
      initial = {v.op.name: sess.run(v) for v in tf1.global_variables()}
      sess.run(train_op)
      expected = {v.op.name: sess.run(v) for v in tf1.global_variables()}

  with tf.Graph().as_default():
    train_op, _, local_init_op, config = _multi_graph(batches, 'replicated')
    variables = tf1.global_variables()
    replicas = [v for v in tf1.local_variables()
                if v.op.name.startswith('tower_')]
    # Same saved variables as the default; the copies are tower 1's.
    assert sorted(v.op.name for v in variables) == sorted(initial)
    assert sorted(v.op.name for v in replicas) == sorted(
        'tower_1/' + v.op.name for v in tf1.trainable_variables())
    assert all(v.device.lower().endswith('cpu:1') for v in replicas)
    with tf1.Session(config=config) as sess:
      sess.run([tf1.global_variables_initializer(),
                tf1.local_variables_initializer()])
      for v in variables:
        v.load(initial[v.op.name], sess)
      sess.run(local_init_op)
      sess.run(train_op)
      got = {v.op.name: sess.run(v) for v in variables + replicas}
  assert got['global_step'] == expected['global_step'] == 1
  assert not np.array_equal(expected['conv1/weights'],
                            initial['conv1/weights'])
  for name, value in expected.items():
    np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-7,
                               err_msg=name)
    if 'tower_1/' + name in got:
      np.testing.assert_array_equal(got['tower_1/' + name], got[name])


def test_replicated_trains_50_steps_with_finite_falling_loss(real_batches,
                                                            cpu_only):
  with tf.Graph().as_default():
    train_op, loss, local_init_op, config = _multi_graph(real_batches[:2],
                                                         'replicated')
    with tf1.Session(config=config) as sess:
      sess.run([tf1.global_variables_initializer(),
                tf1.local_variables_initializer()])
      sess.run(local_init_op)
      losses = [sess.run([train_op, loss])[1] for _ in range(50)]
  _assert_finite_and_falling(losses)


@pytest.mark.skipif(hardware.nchw_runs_here(),
                    reason='NCHW runs here (a GPU, or oneDNN on the CPU)')
def test_nchw_where_it_cannot_run_is_one_line(tmp_path):
  result = run_script('cifar10_train.py', '--data_format=NCHW',
                      '--train_dir=%s' % (tmp_path / 'train'))
  assert result.returncode == 2
  assert error_lines(result.stderr) == [
      'Error: flag --data_format=NCHW: it needs a GPU, or a TensorFlow that '
      'pools channels-first on the CPU (oneDNN, on by default only on CPUs '
      'with AVX512_VNNI, AVX512_BF16 or AMX); this machine has neither: use '
      'NHWC or auto. See --help.']
  assert not os.path.exists(str(tmp_path / 'train'))


def _loss_scale_run(loss_scale, factors):
  """Steps of cifar10.optimizer with --use_fp16 on one variable, whose
  gradient is each of factors in turn.

  Returns:
    A list, per step, of (the variable after it, the 'loss_scale'
    summary's value after it).
  """
  with tf.Graph().as_default():
    var = tf1.get_variable('v', initializer=tf.constant([1.0, 2.0]))
    factor = tf1.placeholder(tf.float32, [])
    train_op = cifar10.optimizer(
        0.5, recipes.TUTORIAL, _opts(use_fp16=True, loss_scale=loss_scale)
    ).minimize(tf.reduce_sum(var) * factor)
    summary, = [s for s in tf1.get_collection(tf1.GraphKeys.SUMMARIES)
                if s.op.get_attr('T') and s.op.inputs[0].op.type == 'Const'
                and b'loss_scale' in s.op.inputs[0].op.get_attr(
                    'value').string_val]
    results = []
    with tf1.Session() as sess:
      sess.run([tf1.global_variables_initializer(),
                tf1.local_variables_initializer()])
      for f in factors:
        sess.run(train_op, {factor: f})
        value, = tf1.Summary.FromString(sess.run(summary)).value
        results.append((sess.run(var), value.simple_value))
  return results


def test_fixed_loss_scale_is_the_flags(cpu_only):
  # The loss is multiplied by the scale before the gradients are taken:
  # 1e37 times a scale of 128 overflows float32, times 1 does not. (A
  # fixed scale skips no step: the infinite gradient is applied.)
  (var, scale), = _loss_scale_run('128', [1e37])
  assert scale == 128
  np.testing.assert_array_equal(var, [-np.inf, -np.inf])
  (var, scale), = _loss_scale_run('1', [1e37])
  assert scale == 1
  np.testing.assert_allclose(var, [1 - 0.5e37, 2 - 0.5e37], rtol=1e-6)
  (var, _), = _loss_scale_run('128', [1.0])  # Unscaled again after.
  np.testing.assert_allclose(var, [0.5, 1.5], rtol=1e-6)


def test_dynamic_loss_scale_halves_skips_and_doubles(cpu_only):
  # 2^15 to start; 2e34 x 2^15 overflows float32; zero gradients are good.
  results = _loss_scale_run('dynamic', [1.0, 2e34] + [0.0] * 2000)
  assert results[0] == (pytest.approx([0.5, 1.5]), 2.0 ** 15)
  var, scale = results[1]
  np.testing.assert_array_equal(var, results[0][0])  # The step skipped.
  assert scale == 2.0 ** 14  # Halved.
  assert results[2000][1] == 2.0 ** 14  # 1,999 good steps since.
  assert results[2001][1] == 2.0 ** 15  # The 2,000th doubles it.
