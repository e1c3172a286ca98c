"""The multi-GPU trainer: averaging, equivalence, placement, end to end."""

import datetime
import glob
import os

import numpy as np
import pytest
import tensorflow as tf

import cifar10
import cifar10_multi_gpu_train as multi
from conftest import STEP_LINE, checkpoint_step, evaluate, run_script
from machinery import errors
from machinery import hardware

tf1 = tf.compat.v1


def _batch(n, seed):
  rng = np.random.RandomState(seed)
  return (tf.constant(rng.normal(size=(n, 24, 24, 3)).astype(np.float32)),
          tf.constant(rng.randint(0, 10, size=n).astype(np.int32)))


def test_average_gradients_is_mean_and_keeps_variables():
  with tf.Graph().as_default():
    v1, v2 = tf1.Variable([1.0, 2.0]), tf1.Variable([[3.0]])
    tower_grads = [
        [(tf.constant([1.0, 4.0]), v1), (tf.constant([[2.0]]), v2)],
        [(tf.constant([3.0, 0.0]), v1), (tf.constant([[5.0]]), v2)],
        [(tf.constant([5.0, 2.0]), v1), (tf.constant([[-1.0]]), v2)],
    ]
    averaged = multi.average_gradients(tower_grads)
    assert [v for _, v in averaged] == [v1, v2]
    with tf1.Session() as sess:
      g1, g2 = sess.run([g for g, _ in averaged])
  np.testing.assert_allclose(g1, [3.0, 2.0])
  np.testing.assert_allclose(g2, [[2.0]])


def _tower_grads(images, labels, num_towers):
  """Averaged gradients of num_towers towers over equal slices."""
  opt = tf1.train.GradientDescentOptimizer(0.1)
  per_tower = images.shape[0] // num_towers
  tower_grads = []
  with tf1.variable_scope(tf1.get_variable_scope(), reuse=tf1.AUTO_REUSE):
    for i in range(num_towers):
      with tf1.name_scope('split%d_tower_%d' % (num_towers, i)) as scope:
        loss = multi.tower_loss(
            scope, images[i * per_tower:(i + 1) * per_tower],
            labels[i * per_tower:(i + 1) * per_tower])
        tower_grads.append(opt.compute_gradients(loss))
  return multi.average_gradients(tower_grads)


def test_towers_on_slices_equal_one_tower_on_whole_batch():
  with tf.Graph().as_default():
    images, labels = _batch(24, seed=3)
    whole = _tower_grads(images, labels, 1)
    split = _tower_grads(images, labels, 3)
    assert [v for _, v in whole] == [v for _, v in split]
    assert len(tf1.trainable_variables()) == 10
    with tf1.Session() as sess:
      sess.run([tf1.global_variables_initializer(),
                tf1.local_variables_initializer()])
      g_whole, g_split = sess.run([[g for g, _ in whole],
                                   [g for g, _ in split]])
  for a, b in zip(g_whole, g_split):
    np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6)


def _two_tower_graph(devices):
  batches = [_batch(8, seed=10), _batch(8, seed=11)]
  with tf.device('/cpu:0'):
    train_op, loss, scaffold = multi.build_train_op(batches, devices)
  return batches, train_op, loss, scaffold.summary_op


def test_one_step_is_sgd_with_averaged_gradient():
  with tf.Graph().as_default():
    batches, train_op, _, _ = _two_tower_graph(['/cpu:0', '/cpu:0'])
    variables = tf1.trainable_variables()
    assert len(variables) == 10  # Shared, not one copy per tower.
    # Each tower's loss: its cross entropy plus its weight decay terms.
    losses = [tf.add_n(tf1.get_collection('losses', 'tower_%d/' % i))
              for i in (0, 1)]
    per_tower = [tf.gradients(l, variables) for l in losses]
    global_step = tf1.train.get_global_step()
    with tf1.Session() as sess:
      sess.run([tf1.global_variables_initializer(),
                tf1.local_variables_initializer()])
      before, g = sess.run([variables, per_tower])
      sess.run(train_op)
      after, step = sess.run([variables, global_step])
  assert step == 1
  for b, g0, g1, a in zip(before, g[0], g[1], after):
    np.testing.assert_allclose(a, b - 0.1 * (g0 + g1) / 2, rtol=1e-5,
                               atol=1e-6)


def test_towers_on_distinct_virtual_cpus_variables_on_cpu0(cpu_only):
  devices, config = hardware.tower_devices(2, virtual=True)
  assert devices == ['/cpu:0', '/cpu:1']
  with tf.Graph().as_default():
    _, train_op, _, _ = _two_tower_graph(devices)
    options = tf1.RunOptions(output_partition_graphs=True)
    metadata = tf1.RunMetadata()
    with tf1.Session(config=config) as sess:
      sess.run([tf1.global_variables_initializer(),
                tf1.local_variables_initializer()])
      sess.run(train_op, options=options, run_metadata=metadata)
  placed = {}
  for partition in metadata.partition_graphs:
    for node in partition.node:
      placed[node.name] = (node.op, node.device.lower())
  for i in (0, 1):
    # The convolutions (forward, fused or not, and backward) of tower i.
    convs = [device for name, (op, device) in placed.items()
             if name.startswith('tower_%d/' % i) and 'Conv2D' in op]
    assert len(convs) >= 4
    assert all(d.endswith('/device:cpu:%d' % i) for d in convs), convs
  variables = [(name, device) for name, (op, device) in placed.items()
               if op in ('VarHandleOp', 'VariableV2')]
  # 10 variables, 10 averages, global step; the noise scale's 2 averages
  # and their counts (machinery/noise_scale.py).
  assert len(variables) == 25
  for name, device in variables:
    assert device.endswith('/device:cpu:0'), (name, device)


def test_more_gpus_than_visible_is_one_clear_error(monkeypatch):
  monkeypatch.setattr(tf.config, 'list_physical_devices',
                      lambda kind=None: ['GPU:0'] if kind == 'GPU' else [])
  with pytest.raises(errors.UsageError,
                     match=r'--num_gpus=3, but only 1 GPU\(s\) are visible'):
    hardware.tower_devices(3)
  devices, _ = hardware.tower_devices(1)
  assert devices == ['/gpu:0']


# The names at the top of a two-tower graph, as TensorBoard's Graphs tab
# shows it: the towers, their average, the model's variables (each with its
# histograms), the input pipeline, the learning rate, the update, the
# moving averages, the summaries TensorBoard gets, and the session's own.
GRAPH_TOP_LEVEL = {
    'tower_0', 'tower_1', 'average_gradients', 'conv1', 'conv2', 'local3',
    'local4', 'softmax_linear', 'global_step', 'input', 'learning_rate',
    'GradientDescent', 'moving_averages', 'gradient_noise_scale', 'summaries',
    'session'}


def _top_level_names(train_dir):
  """The first parts of the op names of the graph in train_dir's event
  files (the one TensorBoard draws)."""
  names = set()
  for path in glob.glob(os.path.join(train_dir, 'events.out.tfevents.*')):
    for event in tf1.train.summary_iterator(path):
      if event.graph_def:
        graph = tf1.GraphDef.FromString(event.graph_def)
        names |= {node.name.split('/')[0] for node in graph.node}
  return names


def _line_time(match):
  """The clock time at the start of a step line."""
  return datetime.datetime.strptime(
      match.group(0).split(': step')[0], '%Y-%m-%d %H:%M:%S.%f')


def test_two_towers_train_resume_checkpoint_and_evaluate(real_data_dir,
                                                         tmp_path):
  train_dir = str(tmp_path / 'train')
  common = ['--num_gpus=2', '--batch_size=32', '--data_dir=' + real_data_dir,
            '--train_dir=' + train_dir]
  num_gpus = len(tf.config.list_physical_devices('GPU'))
  if num_gpus == 1:
    common.append('--virtual_gpus')
  first = run_script('cifar10_multi_gpu_train.py', '--max_steps=30', *common)
  assert first.returncode == 0, first.stderr[-3000:]
  if not num_gpus:
    assert 'No GPU found: running the 2 tower(s) on the CPU.' in first.stdout
  elif num_gpus == 1:
    assert 'GPU 0 is split into 2 virtual GPUs' in first.stdout
  lines = list(STEP_LINE.finditer(first.stdout))
  assert [int(m.group(1)) for m in lines] == [0, 10, 20]
  # examples/sec counts both towers' 64 examples per step: 10 steps of 64
  # in the time between two lines (their clocks); sec/batch is the time
  # of one tower's batch, half a step, printed to 3 decimals.
  for previous, m in zip(lines[1:], lines[2:]):
    seconds = (_line_time(m) - _line_time(previous)).total_seconds()
    examples_per_sec, sec_per_batch = float(m.group(3)), float(m.group(4))
    assert examples_per_sec == pytest.approx(10 * 64 / seconds, rel=0.1)
    assert sec_per_batch == pytest.approx(32 / examples_per_sec, abs=6e-4)
  assert checkpoint_step(train_dir) == 30

  second = run_script('cifar10_multi_gpu_train.py', '--max_steps=40', *common)
  assert second.returncode == 0, second.stderr[-3000:]
  # It resumed (a restart from 0 would also reach 40, in more steps).
  assert 'Resuming from %s/model.ckpt-30.' % train_dir in second.stdout
  assert [int(m.group(1)) for m in STEP_LINE.finditer(second.stdout)] == [30]
  assert checkpoint_step(train_dir) == 40

  names = set(tf.train.load_checkpoint(
      tf.train.latest_checkpoint(train_dir)).get_variable_to_shape_map())
  assert not [n for n in names if n.startswith('tower')]
  model = {n for n in names if not n.endswith('ExponentialMovingAverage')
           and n != 'global_step'}
  assert len(model) == 10
  assert names == model | {n + '/ExponentialMovingAverage' for n in model} | {
      'global_step'}

  tags = set()
  for name in os.listdir(train_dir):
    if name.startswith('events.out.tfevents'):
      for event in tf1.train.summary_iterator(os.path.join(train_dir, name)):
        tags.update(v.tag for v in event.summary.value)
  # The towers' losses raw, as '(raw)' says (the single tower's plain tags
  # are their moving averages).
  for tag in ['learning_rate', 'total_loss (raw)', 'cross_entropy (raw)',
              'conv1/activations', 'local3/sparsity', 'local3/weights',
              'local3/weights/gradients', 'images/image/0']:
    assert tag in tags, sorted(tags)
  assert not [t for t in tags if t.startswith('tower')]
  assert _top_level_names(train_dir) == GRAPH_TOP_LEVEL

  result = evaluate(real_data_dir, train_dir, tmp_path / 'eval',
                    '--num_examples=500')
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'precision @ 1 = ' in result.stdout


def test_replicated_trains_resumes_and_saves_the_model_only(fake_data_dir,
                                                            tmp_path):
  train_dir = str(tmp_path / 'train')
  common = ['--num_gpus=2', '--variable_update=replicated', '--batch_size=8',
            '--data_dir=' + fake_data_dir, '--train_dir=' + train_dir]
  first = run_script('cifar10_multi_gpu_train.py', '--max_steps=10', *common)
  assert first.returncode == 0, first.stderr[-3000:]
  second = run_script('cifar10_multi_gpu_train.py', '--max_steps=20', *common)
  assert second.returncode == 0, second.stderr[-3000:]
  assert 'Resuming from %s/model.ckpt-10.' % train_dir in second.stdout
  assert [int(m.group(1)) for m in STEP_LINE.finditer(second.stdout)] == [10]
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(train_dir))
  assert int(reader.get_tensor('global_step')) == 20
  names = set(reader.get_variable_to_shape_map())
  assert len(names) == 21 and not [n for n in names if 'tower' in n]
  assert _top_level_names(train_dir) == GRAPH_TOP_LEVEL - {
      'average_gradients'} | {'all_reduce', 'copy_to_replicas'}


def _learning_rates(train_dir):
  """{global step: learning rate} of the summaries in train_dir."""
  rates = {}
  for path in glob.glob(os.path.join(train_dir, 'events.out.tfevents.*')):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag == 'learning_rate':
          rates[event.step] = value.simple_value
  return rates


def test_linear_scaling_and_warmup_in_the_learning_rate_summary(
    fake_data_dir, tmp_path):
  train_dir = str(tmp_path / 'train')
  result = run_script('cifar10_multi_gpu_train.py', '--num_gpus=2',
                      '--virtual_gpus', '--batch_size=32', '--max_steps=22',
                      '--learning_rate_scaling=linear', '--warmup_epochs=0.02',
                      '--save_summaries_steps=5', '--data_dir=' + fake_data_dir,
                      '--train_dir=' + train_dir)
  assert result.returncode == 0, result.stderr[-3000:]
  # 64 examples a step: the rate scales to 0.1 * 64 / 128 = 0.05, reached
  # after 0.02 epochs, int(1000 / 64) = 15 steps, from 0.1.
  def rate(step):
    return 0.1 + (0.05 - 0.1) * min(step, 15) / 15
  rates = _learning_rates(train_dir)
  # The summary at global step k is that of the step that made it k.
  assert sorted(rates) == [1, 6, 11, 16, 21]
  for step, value in rates.items():
    assert value == pytest.approx(rate(step - 1)), (step, value)
