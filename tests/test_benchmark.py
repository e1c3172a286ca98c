"""benchmark.py runs every row and prints the table (figures not judged)."""

import os
import re

from absl.testing import flagsaver
import tensorflow as tf
from tensorflow.python.framework import ops

import benchmark
import cifar10
import cifar10_keras
from conftest import run_script
from machinery import environment


def test_flops_per_example_matches_tensorflows_count_of_the_model():
  """Forward flops as TensorFlow's registry counts them, times 3 (forward,
  input and weight gradients), less conv1's input gradient."""
  graph = tf.Graph()
  with graph.as_default():
    cifar10.inference(tf.zeros([1, 24, 24, 3]))
  forward = {}
  for op in graph.get_operations():
    # The LRN's band matmuls are how LRN is computed, not model flops.
    if op.type in ('Conv2D', 'MatMul') and not op.name.startswith('norm'):
      stats = ops.get_stats_for_node_def(graph, op.node_def, 'flops')
      forward[op.name] = stats.value
  assert len(forward) == 5
  assert benchmark.train_flops_per_example() == (
      3 * sum(forward.values()) - forward['conv1/Conv2D'])


def test_benchmark_prints_every_row_with_ratios(real_data_dir):
  result = run_script('benchmark.py', '--data_dir=' + real_data_dir,
                      '--batch_size=16', '--steps=3', '--windows=2',
                      '--warmup=1', '--profile_steps=2',
                      # A small peak: bfloat16's at 4096 takes some 18 s
                      # each of its 3 times on CPUs without bfloat16 units.
                      '--matmul_size=512')
  assert result.returncode == 0, result.stderr[-2000:]
  out = result.stdout
  # A peak for each precision the rows run in: float32 and bfloat16.
  assert re.search(r'^matmul peak \d+\.\d GFLOP/s \(float32 512x512\), '
                   r'bfloat16 \d+\.\d; ', out, re.M)
  cpu = environment.cpu_class(environment.cpu_flags())
  # The peaks again, medians of one before the windows and one after each.
  spread = r'(\d+\.\d) \((\d+\.\d)\.\.(\d+\.\d)\)'
  peaks = re.search(r'^CPU class %s; matmul peaks bfloat16 %s, float32 %s '
                    r'GFLOP/s, medians of 3 \(before the windows and after '
                    r'each\)$' % (cpu, spread, spread), out, re.M)
  assert peaks, out
  for low, median, high in ([peaks.group(i + 2), peaks.group(i + 1),
                             peaks.group(i + 3)] for i in (0, 3)):
    assert 0 < float(low) <= float(median) <= float(high)
  assert len(re.findall(r'^window \d of 2: .*; float32 peak \d+\.\d '
                        r'GFLOP/s$', out, re.M)) == 2
  gpus = tf.config.list_physical_devices('GPU')
  assert ('GPUs: GPU:0 ' if gpus else 'no GPU visible') in out
  # TensorFlow's own oneDNN setting here, and the scripts' (on wherever
  # oneDNN gains: machinery/environment.py).
  by_itself = environment.onednn_by_default(environment.cpu_flags())
  ours = {'1': 'on', '0': 'off'}.get(
      os.environ.get('TF_ENABLE_ONEDNN_OPTS'), 'on' if by_itself else 'off')
  kind = {row: benchmark.ROWS[row].kind for row in benchmark.ROWS}
  for row in benchmark.ROWS:
    names = ([row + '/tf_default', row + '/onednn_on']
             if kind[row] == benchmark.KERAS else [row])
    for name in names:
      match = re.search(r'^\| %s \| .* \| ([A-Z:0-9,]+) \| (on|off) \| '
                        r'(\d+\.\d) \| (\d+\.\d)\.\.(\d+\.\d) \| (.*) \| '
                        r'(.*) \|$' % name, out, re.M)
      assert match, name
      devices, onednn, gflops, projected = match.group(1, 2, 6, 7)
      median, low, high = (float(match.group(i)) for i in (3, 4, 5))
      assert 0 < low <= median <= high
      assert onednn == {'tf_default': 'on' if by_itself else 'off',
                        'onednn_on': 'on'}.get(name.partition('/')[2],
                                               ours), name
      if kind[row] != benchmark.PIPELINE:
        precision = 'bfloat16' if row.endswith('_bf16') else 'float32'
        assert re.match(r'\d+\.\d \(\d+%% of %s\)$' % precision,
                        gflops), gflops
      # The device its convolutions ran on; with a GPU, the two-tower rows
      # run on two (virtual, if need be) GPUs, and the training rows show
      # how long 100K steps would take.
      towers = 2 if row in ('multi2', 'multi2_quiet', 'split',
                            'split_bf16') else 1
      if not gpus or row == 'input':
        assert devices == 'CPU:0' and projected == '', (name, devices)
      else:
        assert devices == ','.join('GPU:%d' % i for i in range(towers)), name
        if kind[row] != benchmark.PIPELINE:
          assert re.match(r'\d+\.\d min$', projected), (name, projected)
  # Ours against each Keras row: the ratio of the two medians the table
  # shows, for every row of ours.
  medians = {m.group(1): float(m.group(2)) for m in re.finditer(
      r'^\| (\S+) \| .* \| (?:on|off) \| (\d+\.\d) \|', out, re.M)}
  ratios = {(m.group(1), m.group(2)): float(m.group(3)) for m in re.finditer(
      r'^(\S+) / (\S+) = (\d+\.\d\d)x$', out, re.M)}
  ours = [r for r in medians if kind[r.split('/')[0]] == benchmark.OURS]
  keras = [r for r in medians if kind[r.split('/')[0]] == benchmark.KERAS]
  assert len(ours) == 4 and len(keras) == 8
  assert sorted(ratios) == sorted((o, k) for o in ours for k in keras)
  # The table rounds each median to 0.1 and the ratio to 0.01; the ratio
  # is of the medians before rounding, so it lies within what the
  # rounded ones allow (a slow row, a few examples/sec, widens that).
  for (o, k), ratio in ratios.items():
    low = (medians[o] - 0.05) / (medians[k] + 0.05) - 0.005
    high = (medians[o] + 0.05) / (medians[k] - 0.05) + 0.005
    assert low <= ratio <= high, (o, k, ratio, medians[o], medians[k])
  # A section per device; the convolutions run on the train row's device.
  sections = re.findall(r'^train row op time on ([A-Z]+:\d+), .*\n'
                        r'((?:\s+\d+\.\d\d ms .*\n?)+)', out, re.M)
  profiles = {device: lines.splitlines() for device, lines in sections}
  train_device = re.search(r'^\| train \| .* \| ([A-Z:0-9,]+) \|', out,
                           re.M).group(1)
  assert train_device in profiles, sorted(profiles)
  for profile in profiles.values():
    shares = [float(line.split()[2].rstrip('%')) for line in profile]
    assert 50 < sum(shares) <= 100.1
  layers = {tuple(line.split()[3:5]) for line in profiles[train_device]}
  # conv2's forward and both of its gradients are among its largest.
  assert sum(1 for layer, op in layers
             if layer == 'conv2' and 'Conv2D' in op) == 3, layers


def test_keras_bf16_model_is_mixed_precision():
  model = cifar10_keras.keras_model('mixed_bfloat16')
  convs = [l for l in model.layers if isinstance(l, tf.keras.layers.Conv2D)]
  assert [l.compute_dtype for l in convs] == ['bfloat16', 'bfloat16']
  assert {v.dtype for v in model.trainable_variables} == {'float32'}
  logits = model(tf.zeros([2, 24, 24, 3]))
  assert logits.dtype == tf.float32 and logits.shape == (2, 10)


def test_rows_the_flags_cannot_run_are_one_line(tmp_path):
  for args, words in [(['--rows=train,split_bf16', '--batch_size=15'],
                       'The split_bf16 row splits --batch_size=15 over 2 '
                       'towers: give an even --batch_size'),
                      (['--rows=split,split_bf16', '--batch_size=15'],
                       'The split and split_bf16 rows split'),
                      (['--rows=split_bf16', '--use_fp16'],
                       'cannot run the bfloat16 rows (split_bf16)'),
                      (['--keras_onednn=tf_default,always'],
                       'Unknown --keras_onednn always')]:
    result = run_script('benchmark.py', '--data_dir=%s' % tmp_path, *args)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith('Error: ') and words in lines[-1], lines
    assert not any('Traceback' in line for line in lines)


def _ops_the_step_runs(graph, fetch):
  """Returns the types of the ops that running fetch needs."""
  needed = tf.compat.v1.graph_util.extract_sub_graph(
      graph.as_graph_def(), [fetch.name.split(':')[0]])
  return {node.op for node in needed.node}


def test_train_held_trains_on_one_batch_without_the_pipeline(
    fake_data_dir, parsed_flags):
  with flagsaver.flagsaver(data_dir=fake_data_dir, batch_size=8):
    how = benchmark.setup()
    sess, held_op, examples = benchmark._graph_session(
        lambda: benchmark.GRAPH_STEPS['held'](benchmark.ROWS['train_held'],
                                              how))
    train_sess, train_op, _ = benchmark._graph_session(
        lambda: benchmark.GRAPH_STEPS['train'](benchmark.ROWS['train'], how))
  assert examples == 8
  train_sess.close()  # Its graph is all this test reads of it.
  # The train row's step takes a batch from the pipeline; the held row's
  # takes none, and trains the model on the batch read as it started.
  assert 'IteratorGetNext' in _ops_the_step_runs(train_sess.graph, train_op)
  held_needs = _ops_the_step_runs(sess.graph, held_op)
  assert 'IteratorGetNext' not in held_needs
  assert 'Conv2D' in held_needs, sorted(held_needs)
  variables = {v.op.name: v for key in ('variables', 'local_variables')
               for v in sess.graph.get_collection(key)}
  images = variables['held_images']
  before = sess.run(images)
  assert before.shape == (8, 24, 24, 3) and before.std() > 0.5
  weights = variables['conv1/weights']
  start = sess.run(weights)
  with sess:
    for _ in range(2):
      sess.run(held_op)
    assert (sess.run(images) == before).all()
    assert not (sess.run(weights) == start).all()


def test_multi2_quiet_is_multi2_without_the_noise_scale(
    fake_data_dir, parsed_flags):
  # Both in this process, so that multi2 / multi2_quiet is the noise
  # scale's cost alone, not a child process's.
  assert not benchmark._row_flags('multi2_quiet')
  steps = {}
  with flagsaver.flagsaver(data_dir=fake_data_dir, batch_size=8):
    for row in ('multi2', 'multi2_quiet'):
      sess, fetch, examples = benchmark._graph_session(
          lambda row=row: benchmark.GRAPH_STEPS[benchmark.ROWS[row].build](
              benchmark.ROWS[row], benchmark.setup()))
      steps[row] = {op.name for op in sess.graph.get_operations()}
      sess.close()
      assert examples == 16
  assert any('gradient_noise_scale' in name for name in steps['multi2'])
  assert not any('gradient_noise_scale' in name
                 for name in steps['multi2_quiet'])
