"""Measures training speed against Keras, the input pipeline and eval.

One run, one data set, one batch size. Every row is set up first and
runs --warmup untimed steps; then the rows take turns, one window of
--steps steps each, --windows times over, so that a machine whose speed
drifts slows every row alike. Each row reports the median examples/sec
over its windows with their spread (min..max).

Rows:
  train            cifar10_train.py's train_op in a plain session
  train_bf16       the same with --use_bf16
  multi1           cifar10_multi_gpu_train.py's train_op, 1 tower
  multi2           cifar10_multi_gpu_train.py's train_op, 2 towers
  split            cifar10_multi_gpu_train.py's train_op, the batch split
                   over 2 towers of --batch_size/2: the same examples and
                   update per step as train
  split_bf16       the same with --use_bf16: the same examples and update
                   per step as train_bf16
  input            the distorted input pipeline alone
  eval             cifar10_eval.py's forward pass and in_top_k
  keras_fit        the same model in Keras, model.fit on a tf.data
                   pipeline with the same preprocessing
  keras_loop       the same Keras model, a custom tf.function train step
  keras_fit_bf16   keras_fit under Keras' mixed_bfloat16 policy
  keras_loop_bf16  keras_loop under mixed_bfloat16

Training rows also show GFLOP/s (convolution and matmul flops of a
training step) against the peak of a 4096x4096 matmul in the row's own
precision (float32, bfloat16, float16), each measured first in the same
run, and the table shows ours / Keras. The Keras rows run twice, each in
a child process of its own (TensorFlow reads the setting once, as it
starts): with TensorFlow's default oneDNN setting on this CPU (/tf_default)
and with oneDNN on (/onednn_on), as our rows run; --keras_onednn chooses.
The CPU's class (AVX2, AVX-512, AVX512_BF16, AMX) heads the table. With
--profile_steps, the train row's op time per step follows, by layer and
op, from the step stats of traced steps.
The model flags (--use_bf16, --use_fp16, --data_format, --xla) and
--variable_update apply to our rows; --keras_jit_compile to Keras'.

Usage:
  python benchmark.py --data_dir=/tmp/cifar10_data
  python benchmark.py --rows=train,keras_fit --steps=50 --windows=3
  python benchmark.py --rows=train --profile_steps=10
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import collections
import os
import re
import time

from absl.testing import flagsaver
import cifar10
import cifar10_eval
import cifar10_input
import cifar10_multi_gpu_train as multi
import cifar10_train
from machinery import cli
from machinery import environment
from machinery import errors
from machinery import hardware
from machinery import row_process
import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
flags = tf1.flags
FLAGS = flags.FLAGS

ROWS = ['train', 'train_bf16', 'multi1', 'multi2', 'split', 'split_bf16',
        'input', 'eval', 'keras_fit', 'keras_loop', 'keras_fit_bf16',
        'keras_loop_bf16']
flags.DEFINE_list('rows', ROWS, 'Rows to run, from %s.' % ', '.join(ROWS))
flags.DEFINE_integer('steps', 50, 'Steps per timed window.', lower_bound=1)
flags.DEFINE_integer('windows', 5, 'Timed windows per row.', lower_bound=1)
flags.DEFINE_integer('warmup', 20, 'Untimed steps before the windows.',
                     lower_bound=0)
flags.DEFINE_enum('keras_jit_compile', 'auto', ['auto', 'true', 'false'],
                  'jit_compile of the Keras rows (auto: Keras decides; it '
                  'compiles nothing on machines without GPUs).')
flags.DEFINE_integer('profile_steps', 0,
                     'Steps of the train row to trace for the op profile; '
                     '0 for none.', lower_bound=0)
KERAS_ONEDNN = ['tf_default', 'onednn_on']
flags.DEFINE_list('keras_onednn', KERAS_ONEDNN,
                  'The oneDNN settings to run the Keras rows in, a child '
                  'process each: tf_default (what TensorFlow does on this '
                  'CPU by itself), onednn_on (as our rows run).')
flags.DEFINE_boolean('row_process', False,
                     'Serve rows to a parent benchmark.py over stdin and '
                     'stdout (machinery/row_process.py); set by the parent.')
flags.adopt_module_key_flags(cifar10)

MATMUL_SIZE = 4096
# How long to time the matmul of each precision, at least 3 runs.
PEAK_SECONDS = 3.0

# GPUs from this compute capability on (Ampere) multiply float32 matrices
# in TF32, TensorFlow's default there.
TF32_GPU_CAPABILITY = (8, 0)

# The GPU rows show how long this many steps would take at their speed.
PROJECTED_STEPS = 100000


def train_flops_per_example():
  """Flops of the convolutions and matmuls of one example's training step.

  Forward, plus the gradients of every weight and of every layer's input
  except the images: 2 flops per multiply-add.

  Returns:
    The flop count (about 105 million).
  """
  conv1 = 24 * 24 * (5 * 5 * 3) * 64
  conv2 = 12 * 12 * (5 * 5 * 64) * 64
  dense = 2304 * 384 + 384 * 192 + 192 * cifar10.NUM_CLASSES
  forward = conv1 + conv2 + dense
  backward = 2 * forward - conv1
  return 2 * (forward + backward)


def matmul_peak(dtype=tf.float32):
  """Measures the GFLOP/s of a 4096x4096 matmul: the median of 3 to 10
  runs, as many as PEAK_SECONDS allow.

  Args:
    dtype: its precision: tf.float32 (on a GPU, as the training rows run
      it: see _float32_matmuls), tf.bfloat16 or tf.float16.

  Returns:
    The GFLOP/s.
  """
  n = MATMUL_SIZE
  with tf.Graph().as_default():
    a = tf1.get_variable('a', [n, n], dtype, tf1.ones_initializer())
    b = tf1.get_variable('b', [n, n], dtype, tf1.ones_initializer())
    # Reduce to a scalar on the device, so no copy of the result is timed.
    product = tf.reduce_sum(tf.matmul(a, b))
    with tf1.Session(config=hardware.session_config()) as sess:
      sess.run(tf1.global_variables_initializer())
      sess.run(product)
      times = []
      while len(times) < 10 and (len(times) < 3 or
                                 sum(times) < PEAK_SECONDS):
        start = time.time()
        sess.run(product)
        times.append(time.time() - start)
  return 2.0 * n ** 3 / np.median(times) / 1e9


def _peaks():
  """Measures the matmul peak of float32 and of each precision the
  training rows run in; returns {precision name: GFLOP/s}."""
  precisions = {'float32'} | {_precision(row) for row in FLAGS.rows
                              if row in TRAINING_ROWS}
  return {name: matmul_peak(tf.as_dtype(name)) for name in sorted(precisions)}


def _precision(row):
  """Names the precision a training row multiplies in: 'float32',
  'bfloat16' or 'float16'."""
  if row in KERAS_ROWS:
    return 'bfloat16' if row.endswith('_bf16') else 'float32'
  if row.endswith('_bf16') or FLAGS.use_bf16:
    return 'bfloat16'
  return 'float16' if FLAGS.use_fp16 else 'float32'


def _onednn_on():
  """Tells whether oneDNN runs this process's CPU ops: 'on', 'off', or '?'
  where this TensorFlow does not say."""
  try:
    from tensorflow.python.util import _pywrap_util_port  # pylint: disable=g-import-not-at-top
    return 'on' if _pywrap_util_port.IsMklEnabled() else 'off'
  except (ImportError, AttributeError):  # A TensorFlow without it.
    return '?'


def _child_environ(setting):
  """The environment of the child process of a --keras_onednn setting.

  tf_default leaves TF_ENABLE_ONEDNN_OPTS to TensorFlow, except on the
  CPUs where the scripts would turn oneDNN on (machinery/environment.py):
  there it says what TensorFlow does by itself, off.
  """
  if setting == 'onednn_on':
    onednn = '1'
  elif environment.onednn_setting(environment.cpu_flags(), {}):
    onednn = '0'
  else:
    onednn = None
  # The GPU, if any, is shared with this process and the other child.
  return {'TF_ENABLE_ONEDNN_OPTS': onednn, 'TF_FORCE_GPU_ALLOW_GROWTH': 'true'}


def _float32_matmuls():
  """Tells how float32 matmuls run here: 'float32', or 'float32 as TF32' where a
  GPU multiplies them in TF32 (a 10-bit mantissa), as TensorFlow does by
  default from Ampere on (tf.config.experimental.
  enable_tensor_float_32_execution turns it off)."""
  if tf.config.experimental.tensor_float_32_execution_enabled() and any(
      capability >= TF32_GPU_CAPABILITY
      for _, capability in hardware.describe_gpus()):
    return 'float32 as TF32'
  return 'float32'


def _gpus_line():
  """Names the GPUs TensorFlow sees, or says there is none."""
  gpus = hardware.describe_gpus()
  if not gpus:
    return 'no GPU visible: every row runs on the CPU'
  return 'GPUs: ' + '; '.join(gpu for gpu, _ in gpus)


def _stepper(step):
  """Returns a timer that runs step() n times and returns the seconds."""
  def timer(n):
    start = time.time()
    for _ in range(n):
      step()
    return time.time() - start
  return timer


def _graph_row(builder):
  """Builds a graph row in a graph and session of its own.

  Args:
    builder: returns (fetch, examples per step, session config or None,
      local init op or None) when called in the row's graph.

  Returns:
    (session, fetch, examples per step), the variables initialized.
  """
  graph = tf.Graph()
  with graph.as_default():
    fetch, examples_per_step, config, local_init = builder()
    inits = [tf1.global_variables_initializer(),
             local_init or tf1.local_variables_initializer()]
  sess = tf1.Session(graph=graph,
                     config=config or hardware.session_config())
  for init in inits:
    sess.run(init)
  return sess, fetch, examples_per_step


def _devices_ran_on(sess, fetch):
  """Runs fetch once; returns where its heaviest ops ran, e.g. 'GPU:0'.

  The devices of the step's convolutions and matmuls, else of all its
  ops, read from the graphs the session actually ran.
  """
  options = tf1.RunOptions(output_partition_graphs=True)
  metadata = tf1.RunMetadata()
  sess.run(fetch, options=options, run_metadata=metadata)
  placed = [(node.op, node.device) for partition in metadata.partition_graphs
            for node in partition.node]
  heavy = [device for op, device in placed
           if op.startswith(('Conv2D', 'MatMul', '_FusedConv2D',
                             '_FusedMatMul'))]
  return ','.join(sorted({tf.DeviceSpec.from_string(d).to_string().split(
      'device:')[-1] for d in heavy or [d for _, d in placed] if d}))


def _timed_graph(builder):
  """Sets up a graph row; returns (timer, examples per step, devices)."""
  sess, fetch, examples_per_step = _graph_row(builder)
  devices = _devices_ran_on(sess, fetch)
  return _stepper(lambda: sess.run(fetch)), examples_per_step, devices


def _eager_device():
  """Names where Keras runs its model: the first GPU if there is one."""
  return 'GPU:0' if tf.config.list_logical_devices('GPU') else 'CPU:0'


def profile_train(steps):
  """Traces steps of the train row after --warmup untimed ones.

  The ops run one at a time (each still on all cores), so that their
  times add up to the step's and none is slowed by another running beside
  it; on this project's machine that costs the step no speed.

  Args:
    steps: how many steps to trace.

  Returns:
    A list of ((device, layer, op type), milliseconds per step), the
    largest first. The device is 'CPU:0', 'GPU:0', ...; the layer is the
    first scope of the op's name, its gradient's included.
  """
  def one_op_at_a_time():
    train_op, examples, config, init = _single_tower()
    config.inter_op_parallelism_threads = 1
    config.use_per_session_threads = True  # Not the pool the rows share.
    return train_op, examples, config, init

  totals = collections.Counter()
  options = tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE)
  sess, train_op, _ = _graph_row(one_op_at_a_time)
  with sess:
    for _ in range(FLAGS.warmup):
      sess.run(train_op)
    for _ in range(steps):
      metadata = tf1.RunMetadata()
      sess.run(train_op, options=options, run_metadata=metadata)
      for device, name, op_type, micros in op_times(metadata.step_stats):
        layer = name.replace('gradients/', '', 1).split('/')[0]
        layer = layer[:-len('_grad')] if layer.endswith('_grad') else layer
        totals[device, layer, op_type or '?'] += micros
  return [(key, micros / steps / 1e3) for key, micros in totals.most_common()]


def op_times(step_stats):
  """Reads the time of each op of a traced step, each counted once.

  A CPU's ops are its device's records. A GPU's are recorded twice: as the
  executor launches them (device '.../device:GPU:0', microseconds of
  launch, not of work) and as kernels on its CUDA streams
  ('.../device:GPU:0/stream:7', where 'stream:all' repeats every stream);
  they are taken from the numbered streams only.

  Args:
    step_stats: a StepStats, from RunMetadata.

  Returns:
    A list of (device, op name, op type, microseconds), the device as
    'CPU:0' or 'GPU:0'.
  """
  times = []
  for device in step_stats.dev_stats:
    name = device.device.upper()
    stream = re.search(r'DEVICE:(GPU:\d+)/STREAM:\d+$', name)
    cpu = re.search(r'DEVICE:(CPU:\d+)$', name)
    if not stream and not cpu:
      continue  # A GPU's launch records, its 'stream:all', its memcpy.
    for node in device.node_stats:
      micros = node.op_end_rel_micros - node.op_start_rel_micros
      if stream:
        # GPU trace records name themselves 'op name:OpType'.
        op_name, _, op_type = node.node_name.partition(':')
      else:
        # timeline_label reads 'name = OpType(inputs)'.
        op_name = node.node_name
        op_type = node.timeline_label.partition(' = ')[2].partition('(')[0]
      times.append(((stream or cpu).group(1), op_name, op_type, micros))
  return times


def _single_tower():
  train_op, _ = cifar10_train.build_train_op()
  return train_op, FLAGS.batch_size, hardware.session_config(), None


def _multi(num_towers):
  # With fewer GPUs than towers, on virtual GPUs (--virtual_gpus); without
  # a GPU, as the trainer runs by default: every tower on /cpu:0.
  train_op, _, scaffold, config = multi.build_graph(
      num_towers, virtual=bool(tf.config.list_physical_devices('GPU')))
  return (train_op, FLAGS.batch_size * num_towers, config,
          scaffold.local_init_op)


def _split():
  # One step's --batch_size split over 2 towers of half of it.
  with flagsaver.flagsaver(batch_size=FLAGS.batch_size // 2):
    return _multi(2)


def _input():
  return cifar10.distorted_inputs(), FLAGS.batch_size, None, None


def _eval():
  return cifar10_eval.correct_predictions(True), FLAGS.batch_size, None, None


def keras_model(policy='float32'):
  """Builds the tutorial's model the usual Keras way.

  Same layers, initializers, weight decay (Keras' l2 is sum(w**2), TF's
  l2_loss half that) and LRN (tf.nn.lrn in a Lambda layer, in float32:
  it has no bfloat16 kernel on CPUs).

  Args:
    policy: the Keras dtype policy of every layer: 'float32' or
      'mixed_bfloat16' (float32 variables, bfloat16 compute; the logits
      come out in float32).

  Returns:
    An uncompiled tf.keras.Model taking [batch, 24, 24, 3] images.
  """
  layers = tf.keras.layers
  def normal(stddev):
    return tf.keras.initializers.TruncatedNormal(stddev=stddev)
  def lrn():
    return layers.Lambda(lambda x: tf.cast(tf.nn.lrn(
        tf.cast(x, tf.float32), 4, bias=1.0, alpha=0.001 / 9.0, beta=0.75),
        x.dtype), dtype=policy)
  decay = tf.keras.regularizers.l2(0.004 / 2)
  constant = tf.keras.initializers.Constant
  return tf.keras.Sequential([
      tf.keras.Input((cifar10.IMAGE_SIZE, cifar10.IMAGE_SIZE, 3)),
      layers.Conv2D(64, 5, padding='same', activation='relu',
                    kernel_initializer=normal(5e-2), dtype=policy),
      layers.MaxPool2D(3, 2, padding='same', dtype=policy),
      lrn(),
      layers.Conv2D(64, 5, padding='same', activation='relu',
                    kernel_initializer=normal(5e-2),
                    bias_initializer=constant(0.1), dtype=policy),
      lrn(),
      layers.MaxPool2D(3, 2, padding='same', dtype=policy),
      layers.Flatten(dtype=policy),
      layers.Dense(384, activation='relu', kernel_initializer=normal(0.04),
                   bias_initializer=constant(0.1), kernel_regularizer=decay,
                   dtype=policy),
      layers.Dense(192, activation='relu', kernel_initializer=normal(0.04),
                   bias_initializer=constant(0.1), kernel_regularizer=decay,
                   dtype=policy),
      layers.Dense(cifar10.NUM_CLASSES, kernel_initializer=normal(1 / 192.0),
                   dtype=policy),
      layers.Activation('linear', dtype='float32'),
  ])


def _keras_jit_compile():
  """Returns --keras_jit_compile as Keras' compile() takes it."""
  return {'auto': 'auto', 'true': True, 'false': False}[
      FLAGS.keras_jit_compile]


def _keras_dataset():
  return cifar10_input.distorted_dataset(
      FLAGS.data_dir, FLAGS.batch_size, tf.data.AUTOTUNE)


def _keras_fit(policy):
  """Times model.fit, a call per window, by a callback at each batch end.

  Args:
    policy: the Keras dtype policy (see keras_model).

  Returns:
    (timer, examples per step): the timer runs n + 1 steps in one fit call
    and returns the seconds from the end of its first step to the end of
    its last, so the call's set-up is not timed.
  """
  model = keras_model(policy)
  model.compile(
      optimizer=tf.keras.optimizers.SGD(FLAGS.initial_learning_rate),
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      jit_compile=_keras_jit_compile())
  dataset = _keras_dataset()
  ends = []

  class Clock(tf.keras.callbacks.Callback):

    def on_train_batch_end(self, batch, logs=None):
      ends.append(time.time())

  def timer(n):
    del ends[:]
    model.fit(dataset, epochs=1, verbose=0, callbacks=[Clock()],
              steps_per_epoch=n + 1)
    return ends[-1] - ends[0]

  return timer, FLAGS.batch_size, _eager_device()


def _keras_loop(policy):
  """Times a custom tf.function train step over the same Keras model.

  Args:
    policy: the Keras dtype policy (see keras_model).

  Returns:
    (timer, examples per step).
  """
  model = keras_model(policy)
  opt = tf.keras.optimizers.SGD(FLAGS.initial_learning_rate)
  cross_entropy = tf.keras.losses.SparseCategoricalCrossentropy(
      from_logits=True)

  @tf.function(jit_compile=_keras_jit_compile() is True)
  def train_step(images, labels):
    with tf.GradientTape() as tape:
      logits = model(images, training=True)
      loss = cross_entropy(labels, logits) + tf.add_n(model.losses)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  batches = iter(_keras_dataset())
  return (_stepper(lambda: train_step(*next(batches)).numpy()),
          FLAGS.batch_size, _eager_device())


BUILDERS = {
    'train': ('cifar10_train.py graph, 1 tower',
              lambda: _timed_graph(_single_tower)),
    'train_bf16': ('cifar10_train.py graph, 1 tower, --use_bf16',
                   lambda: _timed_graph(
                       flagsaver.flagsaver(use_bf16=True)(_single_tower))),
    'multi1': ('cifar10_multi_gpu_train.py graph, 1 tower',
               lambda: _timed_graph(lambda: _multi(1))),
    'multi2': ('cifar10_multi_gpu_train.py graph, 2 towers',
               lambda: _timed_graph(lambda: _multi(2))),
    'split': ('cifar10_multi_gpu_train.py graph, 2 towers of half the '
              'batch',
              lambda: _timed_graph(_split)),
    'split_bf16': ('cifar10_multi_gpu_train.py graph, 2 towers of half '
                   'the batch, --use_bf16',
                   lambda: _timed_graph(
                       flagsaver.flagsaver(use_bf16=True)(_split))),
    'input': ('input pipeline alone (distorted batches)',
              lambda: _timed_graph(_input)),
    'eval': ('eval forward pass + in_top_k',
             lambda: _timed_graph(_eval)),
    'keras_fit': ('Keras model.fit, same model and data',
                  lambda: _keras_fit('float32')),
    'keras_loop': ('Keras model, custom tf.function step',
                   lambda: _keras_loop('float32')),
    'keras_fit_bf16': ('Keras model.fit, mixed_bfloat16',
                       lambda: _keras_fit('mixed_bfloat16')),
    'keras_loop_bf16': ('Keras custom step, mixed_bfloat16',
                        lambda: _keras_loop('mixed_bfloat16')),
}
KERAS_ROWS = ('keras_fit', 'keras_loop', 'keras_fit_bf16', 'keras_loop_bf16')
OURS_AGAINST_KERAS = ('train', 'train_bf16', 'split', 'split_bf16')
TRAINING_ROWS = OURS_AGAINST_KERAS + ('multi1', 'multi2') + KERAS_ROWS


def _print_profile(profile):
  """Prints profile_train's result, device by device: the ops that take 1%
  or more of that device's time (a GPU's kernels are a small part of a
  step whose variables are updated on the CPU)."""
  for device in sorted({device for (device, _, _), _ in profile}):
    ops = [(key[1:], ms) for key, ms in profile if key[0] == device]
    total = sum(ms for _, ms in ops)
    print()
    print('train row op time on %s, one op at a time: %.1f ms per step over '
          '%d traced steps' % (device, total, FLAGS.profile_steps))
    for (layer, op_type), ms in ops:
      if ms >= total / 100:
        print('%8.2f ms %5.1f%%  %-24s %s' % (ms, 100 * ms / total, layer,
                                              op_type))


def _check_rows():
  """Raises errors.UsageError for --rows the other flags cannot run."""
  unknown = set(FLAGS.rows) - set(ROWS)
  if unknown:
    raise errors.UsageError(
        'Unknown --rows %s; choose from %s.'
        % (','.join(sorted(unknown)), ','.join(ROWS)))
  bf16_rows = {'train_bf16', 'split_bf16'} & set(FLAGS.rows)
  if FLAGS.use_fp16 and bf16_rows:
    raise errors.UsageError(
        '--use_fp16 cannot run the bfloat16 rows (%s): leave them out of '
        '--rows.' % ','.join(sorted(bf16_rows)))
  unknown = set(FLAGS.keras_onednn) - set(KERAS_ONEDNN)
  if unknown or not FLAGS.keras_onednn:
    raise errors.UsageError(
        'Unknown --keras_onednn %s; choose one or both of %s.'
        % (','.join(sorted(unknown)), ','.join(KERAS_ONEDNN)))
  split_rows = {'split', 'split_bf16'} & set(FLAGS.rows)
  if split_rows and FLAGS.batch_size % 2:
    raise errors.UsageError(
        'The %s %s --batch_size=%d over 2 towers: give an even '
        '--batch_size.' % (' and '.join(sorted(split_rows)),
                           'rows split' if len(split_rows) > 1
                           else 'row splits', FLAGS.batch_size))


def _table_rows():
  """The rows as the table names them: a Keras row once per --keras_onednn
  setting (keras_fit/tf_default, keras_fit/onednn_on), the others as they
  are."""
  names = []
  for row in FLAGS.rows:
    names += ([row + '/' + setting for setting in FLAGS.keras_onednn]
              if row in KERAS_ROWS else [row])
  return names


def _print_table(timers, rates, peaks, flops):
  """Prints each row's median rate, spread, GFLOP/s and 100K-step time,
  then ours / Keras.

  Args:
    timers: {table row: (timer, examples per step, devices, oneDNN)}.
    rates: {table row: examples/sec of each window}.
    peaks: {precision: the matmul peak, GFLOP/s}.
    flops: flops of one example's training step.
  """
  medians = {}
  lines = []
  for name in _table_rows():
    row = name.split('/')[0]
    _, examples_per_step, devices, onednn = timers[name]
    medians[name] = np.median(rates[name])
    gflops = projected = ''
    if row in TRAINING_ROWS:
      rate = medians[name] * flops / 1e9
      gflops = '%.1f (%.0f%% of %s)' % (
          rate, 100 * rate / peaks[_precision(row)], _precision(row))
      if 'GPU' in devices:
        projected = '%.1f min' % (
            PROJECTED_STEPS * examples_per_step / medians[name] / 60)
    lines.append((name, BUILDERS[row][0], devices, onednn, medians[name],
                  min(rates[name]), max(rates[name]), gflops, projected))
    print('%-21s %-44s %-11s oneDNN %-3s %8.1f examples/sec (%.1f..%.1f) '
          '%s %s' % lines[-1])
  print()
  print('CPU class %s; matmul peaks %s GFLOP/s' % (
      environment.cpu_class(environment.cpu_flags()), ', '.join(
          '%s %.1f' % item for item in sorted(peaks.items()))))
  print()
  print('| row | what | device | oneDNN | examples/sec (median) | min..max '
        '| GFLOP/s (of its precision\'s peak) | %dK steps |'
        % (PROJECTED_STEPS // 1000))
  print('| --- | --- | --- | --- | ---: | --- | --- | ---: |')
  for line in lines:
    print('| %s | %s | %s | %s | %.1f | %.1f..%.1f | %s | %s |' % line)
  for ours in OURS_AGAINST_KERAS:
    for keras in sorted(medians):
      if ours in medians and keras.split('/')[0] in KERAS_ROWS:
        print('%s / %s = %.2fx' % (ours, keras,
                                   medians[ours] / medians[keras]))


def _bf16_rows_notice():
  """Prints that the bfloat16 rows will be slow here, where they will (as
  --use_bf16 says it for the scripts)."""
  if {'train_bf16', 'split_bf16'} & set(FLAGS.rows) and not FLAGS.use_bf16:
    notice = hardware.precision_notice(use_fp16=False, use_bf16=True)
    if notice:
      print(notice)


def _set_up_rows(children):
  """Builds every row and runs its warm-up steps.

  Args:
    children: {--keras_onednn setting: its row_process.RowProcess}.

  Returns:
    {table row: (timer, examples per step, devices, oneDNN)}.
  """
  timers = {}
  for name in _table_rows():
    print('setting up %s, %d warm-up steps' % (name, FLAGS.warmup))
    row, _, setting = name.partition('/')
    if setting:  # A Keras row, in the child process of its setting.
      timers[name] = children[setting].setup(row) + (
          children[setting].describe(),)
    else:
      timers[name] = BUILDERS[row][1]() + (_onednn_on(),)
      timers[name][0](FLAGS.warmup)
  return timers


def _run_windows(timers):
  """Times --windows windows of --steps steps of every row, the rows
  taking turns, a window each, so that drift slows all alike.

  Returns:
    {table row: examples/sec of each window}.
  """
  rates = {name: [] for name in timers}
  for window in range(FLAGS.windows):
    for name, (timer, examples_per_step, _, _) in timers.items():
      rates[name].append(FLAGS.steps * examples_per_step /
                         timer(FLAGS.steps))
    print('window %d of %d: %s' % (window + 1, FLAGS.windows, ', '.join(
        '%s %.1f' % (name, rates[name][-1]) for name in timers)))
  return rates


def main(argv=None):  # pylint: disable=unused-argument
  if FLAGS.row_process:  # A child of another benchmark.py: its Keras rows.
    row_process.serve({row: BUILDERS[row][1] for row in KERAS_ROWS},
                      FLAGS.warmup, _onednn_on)
    return
  _check_rows()
  cifar10.maybe_download_and_extract()
  peaks = _peaks()
  flops = train_flops_per_example()
  print('batch_size %d per tower, warm-up %d steps, %d windows of %d steps'
        % (FLAGS.batch_size, FLAGS.warmup, FLAGS.windows, FLAGS.steps))
  print('matmul peak %.1f GFLOP/s (%s %dx%d)%s; training step %.1f MFLOP '
        'per example' % (peaks['float32'], _float32_matmuls(), MATMUL_SIZE,
                         MATMUL_SIZE, ''.join(
                             ', %s %.1f' % item for item in sorted(
                                 peaks.items()) if item[0] != 'float32'),
                         flops / 1e6))
  print('CPU class %s; oneDNN %s in this process (our rows)' % (
      environment.cpu_class(environment.cpu_flags()), _onednn_on()))
  print(_gpus_line())
  _bf16_rows_notice()
  children = {}
  if set(FLAGS.rows) & set(KERAS_ROWS):
    children = {setting: row_process.RowProcess(
        __file__, _child_environ(setting), FLAGS.flags_into_string())
                for setting in FLAGS.keras_onednn}
  try:
    timers = _set_up_rows(children)
    rates = _run_windows(timers)
  finally:
    for child in children.values():
      child.close()
  print()
  _print_table(timers, rates, peaks, flops)
  if FLAGS.profile_steps:
    _print_profile(profile_train(FLAGS.profile_steps))


if __name__ == '__main__':
  cli.run_main(main)
