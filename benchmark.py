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
  split_bf16       cifar10_multi_gpu_train.py's train_op, --use_bf16, the
                   batch split over 2 towers of --batch_size/2: the same
                   examples and update per step as train_bf16
  input            the distorted input pipeline alone
  eval             cifar10_eval.py's forward pass and in_top_k
  keras_fit        the same model in Keras, model.fit on a tf.data
                   pipeline with the same preprocessing
  keras_loop       the same Keras model, a custom tf.function train step
  keras_fit_bf16   keras_fit under Keras' mixed_bfloat16 policy
  keras_loop_bf16  keras_loop under mixed_bfloat16

Training rows also show GFLOP/s (convolution and matmul flops of a
training step) against the peak of a 4096x4096 float32 matmul measured
first in the same run, and the table shows ours / Keras. With
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
import re
import time

from absl.testing import flagsaver
import cifar10
import cifar10_eval
import cifar10_input
import cifar10_multi_gpu_train as multi
import cifar10_train
from machinery import cli
from machinery import errors
from machinery import hardware
import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
flags = tf1.flags
FLAGS = flags.FLAGS

ROWS = ['train', 'train_bf16', 'multi1', 'multi2', 'split_bf16', 'input',
        'eval', 'keras_fit', 'keras_loop', 'keras_fit_bf16', 'keras_loop_bf16']
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
flags.adopt_module_key_flags(cifar10)

MATMUL_SIZE = 4096

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


def matmul_peak():
  """Measures the GFLOP/s of a float32 4096x4096 matmul, median of 10, as
  the training rows run float32 (see _float32_matmuls)."""
  n = MATMUL_SIZE
  with tf.Graph().as_default():
    a = tf1.get_variable('a', [n, n], initializer=tf1.ones_initializer())
    b = tf1.get_variable('b', [n, n], initializer=tf1.ones_initializer())
    # Reduce to a scalar on the device, so no copy of the result is timed.
    product = tf.reduce_sum(tf.matmul(a, b))
    with tf1.Session(config=hardware.session_config()) as sess:
      sess.run(tf1.global_variables_initializer())
      sess.run(product)
      times = []
      for _ in range(10):
        start = time.time()
        sess.run(product)
        times.append(time.time() - start)
  return 2.0 * n ** 3 / np.median(times) / 1e9


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
    'split_bf16': ('cifar10_multi_gpu_train.py graph, 2 towers of half '
                   'the batch, --use_bf16',
                   lambda: _timed_graph(flagsaver.flagsaver(
                       use_bf16=True, batch_size=FLAGS.batch_size // 2)(
                           lambda: _multi(2)))),
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
OURS_AGAINST_KERAS = ('train', 'train_bf16', 'split_bf16')
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
  if 'split_bf16' in FLAGS.rows and FLAGS.batch_size % 2:
    raise errors.UsageError(
        'The split_bf16 row splits --batch_size=%d over 2 towers: give an '
        'even --batch_size.' % FLAGS.batch_size)


def _print_table(timers, rates, peak, flops):
  """Prints each row's median rate, spread, GFLOP/s and 100K-step time,
  then ours / Keras.

  Args:
    timers: {row: (timer, examples per step, devices)}.
    rates: {row: examples/sec of each window}.
    peak: the matmul peak, GFLOP/s.
    flops: flops of one example's training step.
  """
  medians = {}
  lines = []
  for row in FLAGS.rows:
    title = BUILDERS[row][0]
    _, examples_per_step, devices = timers[row]
    medians[row] = np.median(rates[row])
    gflops = projected = ''
    if row in TRAINING_ROWS:
      rate = medians[row] * flops / 1e9
      gflops = '%.1f (%.0f%%)' % (rate, 100 * rate / peak)
      if 'GPU' in devices:
        projected = '%.1f min' % (
            PROJECTED_STEPS * examples_per_step / medians[row] / 60)
    lines.append((row, title, devices, medians[row], min(rates[row]),
                  max(rates[row]), gflops, projected))
    print('%-15s %-44s %-11s %8.1f examples/sec (%.1f..%.1f) %s %s'
          % lines[-1])
  print()
  print('| row | what | device | examples/sec (median) | min..max | GFLOP/s '
        '(of peak) | %dK steps |' % (PROJECTED_STEPS // 1000))
  print('| --- | --- | --- | ---: | --- | --- | ---: |')
  for line in lines:
    print('| %s | %s | %s | %.1f | %.1f..%.1f | %s | %s |' % line)
  for ours in OURS_AGAINST_KERAS:
    for keras in KERAS_ROWS:
      if ours in medians and keras in medians:
        print('%s / %s = %.2fx' % (ours, keras,
                                   medians[ours] / medians[keras]))


def _bf16_rows_notice():
  """Prints that the bfloat16 rows will be slow here, where they will (as
  --use_bf16 says it for the scripts)."""
  if {'train_bf16', 'split_bf16'} & set(FLAGS.rows) and not FLAGS.use_bf16:
    notice = hardware.precision_notice(use_fp16=False, use_bf16=True)
    if notice:
      print(notice)


def main(argv=None):  # pylint: disable=unused-argument
  _check_rows()
  cifar10.maybe_download_and_extract()
  peak = matmul_peak()
  flops = train_flops_per_example()
  print('batch_size %d per tower, warm-up %d steps, %d windows of %d steps'
        % (FLAGS.batch_size, FLAGS.warmup, FLAGS.windows, FLAGS.steps))
  print('matmul peak %.1f GFLOP/s (%s %dx%d); training step %.1f '
        'MFLOP per example' % (peak, _float32_matmuls(), MATMUL_SIZE,
                               MATMUL_SIZE, flops / 1e6))
  print(_gpus_line())
  _bf16_rows_notice()
  timers = {}
  for row in FLAGS.rows:
    print('setting up %s, %d warm-up steps' % (row, FLAGS.warmup))
    timers[row] = BUILDERS[row][1]()
    timers[row][0](FLAGS.warmup)
  # The rows take turns, a window each, so that drift slows all alike.
  rates = {row: [] for row in FLAGS.rows}
  for window in range(FLAGS.windows):
    for row in FLAGS.rows:
      timer, examples_per_step, _ = timers[row]
      rates[row].append(FLAGS.steps * examples_per_step / timer(FLAGS.steps))
    print('window %d of %d: %s' % (window + 1, FLAGS.windows, ', '.join(
        '%s %.1f' % (row, rates[row][-1]) for row in FLAGS.rows)))
  print()
  _print_table(timers, rates, peak, flops)
  if FLAGS.profile_steps:
    _print_profile(profile_train(FLAGS.profile_steps))


if __name__ == '__main__':
  cli.run_main(main)
