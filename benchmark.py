"""Measures training speed against Keras, the input pipeline and eval.

One run, one data set, one batch size. Every row is set up first and
runs --warmup untimed steps; then the rows take turns, one window of
--steps steps each, --windows times over, so that a machine whose speed
drifts slows every row alike. Each row reports the median examples/sec
over its windows with their spread (min..max).

Rows:
  train            cifar10_train.py's train_op in a plain session
  train_bf16       the same with --use_bf16
  train_held       the same step on one distorted batch read once and held
                   in memory: the input pipeline does no work beside the
                   step, so train / train_held is what feeding costs it
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
precision (float32, bfloat16, float16), measured in the same run before
the windows and after each (the median; a CPU's peak drifts as its rows'
speeds do), and the table shows ours / Keras. The Keras rows run twice, each in
a child process of its own (TensorFlow reads the setting once, as it
starts): with TensorFlow's default oneDNN setting on this CPU (/tf_default)
and with oneDNN on (/onednn_on), as our rows run; --keras_onednn chooses.
The CPU's class (AVX2, AVX-512, AVX512_BF16, AMX) heads the table. With
--profile_steps, the train row's op time per step follows, by layer and
op, from the step stats of traced steps.
The model flags (--use_bf16, --use_fp16, --data_format, --xla) and
--variable_update apply to our rows; --keras_jit_compile to Keras'. A
row that needs other flags than the command line's (train_bf16's
--use_bf16, split's half --batch_size) runs in a child process started
with them, as the Keras rows do (machinery/row_process.py); the Keras
model is cifar10_keras.py's, the peaks and the profile come from
machinery/probes.py and machinery/profiler.py.

Usage:
  python benchmark.py --data_dir=/tmp/cifar10_data
  python benchmark.py --rows=train,keras_fit --steps=50 --windows=3
  python benchmark.py --rows=train --profile_steps=10
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import collections
import time

import cifar10
import cifar10_eval
import cifar10_input
import cifar10_keras
import cifar10_multi_gpu_train as multi
import cifar10_train
from machinery import cli
from machinery import environment
from machinery import errors
from machinery import hardware
from machinery import probes
from machinery import profiler
from machinery import row_process
import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
flags = tf1.flags
FLAGS = flags.FLAGS

# What a row times: our training step, compared with Keras' (OURS); our
# towers' step, or our step without its input (TOWERS); Keras' training
# step, once per --keras_onednn setting (KERAS); a step that trains
# nothing (PIPELINE).
OURS, TOWERS, KERAS, PIPELINE = 'ours', 'towers', 'keras', 'pipeline'

# The GPU rows show how long this many steps would take at their speed.
PROJECTED_STEPS = 100000

KERAS_ONEDNN = ['tf_default', 'onednn_on']


def _stepper(step):
  """Returns a timer that runs step() n times and returns the seconds."""
  def timer(n):
    start = time.time()
    for _ in range(n):
      step()
    return time.time() - start
  return timer


def _timed_graph(builder):
  """Builds a graph row in a graph and session of its own, its variables
  initialized.

  Args:
    builder: returns (fetch, examples per step, session config or None,
      local init op or None) when called in the row's graph.

  Returns:
    (timer, examples per step, the devices its heaviest ops ran on).
  """
  sess, fetch, examples_per_step = _graph_session(builder)
  devices = probes.devices_ran_on(sess, fetch)
  return _stepper(lambda: sess.run(fetch)), examples_per_step, devices


def _graph_session(builder):
  """Returns (session, fetch, examples per step) of builder's graph, its
  variables initialized (see _timed_graph)."""
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


def _single_tower():
  """cifar10_train.py's step."""
  train_op, _ = cifar10_train.build_train_op()
  return train_op, FLAGS.batch_size, hardware.session_config(), None


def _held_batch_tower():
  """cifar10_train.py's step on one distorted batch, read from the input
  pipeline once (as the variables are initialized) and then held in
  memory on the CPU, where the pipeline's batches are: every step trains
  on it, and no input work runs beside the step."""
  pipeline = cifar10.distorted_inputs

  def held_batch():
    images, labels = pipeline()
    return (tf1.get_local_variable('held_images', initializer=images),
            tf1.get_local_variable('held_labels', initializer=labels))

  cifar10.distorted_inputs = held_batch  # As build_train_op calls it.
  try:
    return _single_tower()
  finally:
    cifar10.distorted_inputs = pipeline


def _multi(num_towers):
  """cifar10_multi_gpu_train.py's step on num_towers towers: with fewer
  GPUs than towers on virtual GPUs; without a GPU, as the trainer runs by
  default, every tower on /cpu:0."""
  train_op, _, scaffold, config = multi.build_graph(
      num_towers, virtual=bool(tf.config.list_physical_devices('GPU')),
      variable_update=FLAGS.variable_update)
  return (train_op, FLAGS.batch_size * num_towers, config,
          scaffold.local_init_op)


def _input():
  """The distorted input pipeline alone."""
  return cifar10.distorted_inputs(), FLAGS.batch_size, None, None


def _eval():
  """The evaluator's forward pass and top-1 check."""
  return cifar10_eval.correct_predictions(True), FLAGS.batch_size, None, None


def _keras_jit_compile():
  """Returns --keras_jit_compile as Keras' compile() takes it."""
  return {'auto': 'auto', 'true': True, 'false': False}[
      FLAGS.keras_jit_compile]


def _keras_dataset():
  """The distorted training batches as a tf.data pipeline, for Keras."""
  return cifar10_input.distorted_dataset(
      FLAGS.data_dir, FLAGS.batch_size, tf.data.AUTOTUNE)


def _eager_device():
  """Names where Keras runs its model: the first GPU if there is one."""
  return 'GPU:0' if tf.config.list_logical_devices('GPU') else 'CPU:0'


def _keras_fit(policy):
  """Times model.fit, a call per window, by a callback at each batch end.

  Args:
    policy: the Keras dtype policy (cifar10_keras.keras_model).

  Returns:
    (timer, examples per step, device): the timer runs n + 1 steps in one
    fit call and returns the seconds from the end of its first step to the
    end of its last, so the call's set-up is not timed.
  """
  model = cifar10_keras.keras_model(policy)
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
    policy: the Keras dtype policy (cifar10_keras.keras_model).

  Returns:
    (timer, examples per step, device).
  """
  model = cifar10_keras.keras_model(policy)
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


def _bf16():
  """The flags of a row in bfloat16."""
  return ('--use_bf16',)


def _half_batch():
  """The flags of a row that splits --batch_size over two towers."""
  return ('--batch_size=%d' % (FLAGS.batch_size // 2),)


def _none():
  """The flags of a row that runs with the command line's."""
  return ()


# The rows: what each times (for the table), how to build it (returning
# (timer, examples per step, devices)), its kind, and the flags it needs
# beyond the command line's (a function of them).
Row = collections.namedtuple('Row', ['what', 'build', 'kind', 'flags'])
ROWS = collections.OrderedDict([
    ('train', Row('cifar10_train.py graph, 1 tower',
                  lambda: _timed_graph(_single_tower), OURS, _none)),
    ('train_bf16', Row('cifar10_train.py graph, 1 tower, --use_bf16',
                       lambda: _timed_graph(_single_tower), OURS, _bf16)),
    ('train_held', Row('cifar10_train.py graph, 1 tower, one held batch',
                       lambda: _timed_graph(_held_batch_tower), TOWERS,
                       _none)),
    ('multi1', Row('cifar10_multi_gpu_train.py graph, 1 tower',
                   lambda: _timed_graph(lambda: _multi(1)), TOWERS, _none)),
    ('multi2', Row('cifar10_multi_gpu_train.py graph, 2 towers',
                   lambda: _timed_graph(lambda: _multi(2)), TOWERS, _none)),
    ('split', Row('cifar10_multi_gpu_train.py graph, 2 towers of half the '
                  'batch', lambda: _timed_graph(lambda: _multi(2)), OURS,
                  _half_batch)),
    ('split_bf16', Row('cifar10_multi_gpu_train.py graph, 2 towers of half '
                       'the batch, --use_bf16',
                       lambda: _timed_graph(lambda: _multi(2)), OURS,
                       lambda: _half_batch() + _bf16())),
    ('input', Row('input pipeline alone (distorted batches)',
                  lambda: _timed_graph(_input), PIPELINE, _none)),
    ('eval', Row('eval forward pass + in_top_k',
                 lambda: _timed_graph(_eval), PIPELINE, _none)),
    ('keras_fit', Row('Keras model.fit, same model and data',
                      lambda: _keras_fit('float32'), KERAS, _none)),
    ('keras_loop', Row('Keras model, custom tf.function step',
                       lambda: _keras_loop('float32'), KERAS, _none)),
    ('keras_fit_bf16', Row('Keras model.fit, mixed_bfloat16',
                           lambda: _keras_fit('mixed_bfloat16'), KERAS,
                           _none)),
    ('keras_loop_bf16', Row('Keras custom step, mixed_bfloat16',
                            lambda: _keras_loop('mixed_bfloat16'), KERAS,
                            _none)),
])
TRAINING = (OURS, TOWERS, KERAS)

flags.DEFINE_list('rows', list(ROWS),
                  'Rows to run, from %s.' % ', '.join(ROWS))
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
flags.DEFINE_list('keras_onednn', KERAS_ONEDNN,
                  'The oneDNN settings to run the Keras rows in, a child '
                  'process each: tf_default (what TensorFlow does on this '
                  'CPU by itself), onednn_on (as our rows run).')
flags.DEFINE_boolean('row_process', False,
                     'Serve rows to a parent benchmark.py over stdin and '
                     'stdout (machinery/row_process.py); set by the parent.')
flags.adopt_module_key_flags(cifar10)


def train_flops_per_example():
  """Counts the flops of the convolutions and matmuls of one example's
  training step: forward, plus the gradients of every weight and of every
  layer's input except the images, 2 flops per multiply-add.

  Returns:
    The flop count (about 105 million).
  """
  conv1 = 24 * 24 * (5 * 5 * 3) * 64
  conv2 = 12 * 12 * (5 * 5 * 64) * 64
  dense = 2304 * 384 + 384 * 192 + 192 * cifar10.NUM_CLASSES
  forward = conv1 + conv2 + dense
  backward = 2 * forward - conv1
  return 2 * (forward + backward)


def _precision(row):
  """Names the precision a training row multiplies in: 'float32',
  'bfloat16' or 'float16'."""
  if '--use_bf16' in ROWS[row].flags() or (
      FLAGS.use_bf16 and ROWS[row].kind != KERAS):
    return 'bfloat16'
  if ROWS[row].kind == KERAS:
    return 'bfloat16' if row.endswith('_bf16') else 'float32'
  return 'float16' if FLAGS.use_fp16 else 'float32'


def _peaks():
  """Measures the matmul peak of float32 and of each precision the
  training rows run in; returns {precision name: GFLOP/s}."""
  precisions = {'float32'} | {_precision(row) for row in FLAGS.rows
                              if ROWS[row].kind in TRAINING}
  return {name: probes.matmul_peak(tf.as_dtype(name))
          for name in sorted(precisions)}


def _median_peaks(samples):
  """Returns {precision: the median of its peak samples} from a list of
  _peaks() results."""
  return {name: np.median([sample[name] for sample in samples])
          for name in samples[0]}


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


def _table_rows():
  """Returns the rows as the table names them, with the process each runs
  in: {table row: None for this one, or (environment, extra flags) of a
  child}. A Keras row runs once per --keras_onednn setting
  (keras_fit/tf_default, keras_fit/onednn_on), in a child of that setting;
  a row that needs other flags, in a child with them."""
  names = collections.OrderedDict()
  for row in FLAGS.rows:
    if ROWS[row].kind == KERAS:
      for setting in FLAGS.keras_onednn:
        names[row + '/' + setting] = (setting, ())
    elif ROWS[row].flags():
      names[row] = (None, ROWS[row].flags())
    else:
      names[row] = None
  return names


def _check_rows():
  """Raises errors.UsageError for --rows the other flags cannot run."""
  unknown = set(FLAGS.rows) - set(ROWS)
  if unknown:
    raise errors.UsageError(
        'Unknown --rows %s; choose from %s.'
        % (','.join(sorted(unknown)), ','.join(ROWS)))
  bf16_rows = {row for row in FLAGS.rows if '--use_bf16' in ROWS[row].flags()}
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


def _start_children(table_rows):
  """Starts a child process for each environment and flags the rows need.

  Returns:
    {(environment setting, extra flags): its row_process.RowProcess}.
  """
  children = {}
  for key in sorted(set(table_rows.values()) - {None}, key=str):
    setting, extra_flags = key
    children[key] = row_process.RowProcess(
        __file__, _child_environ(setting) if setting else {},
        FLAGS.flags_into_string(), extra_flags)
  return children


def _set_up_rows(table_rows, children):
  """Builds every row and runs its warm-up steps.

  Args:
    table_rows: _table_rows().
    children: _start_children()'s.

  Returns:
    {table row: (timer, examples per step, devices, oneDNN)}.
  """
  timers = collections.OrderedDict()
  for name, process in table_rows.items():
    print('setting up %s, %d warm-up steps' % (name, FLAGS.warmup))
    row = name.partition('/')[0]
    if process:
      child = children[process]
      timers[name] = child.setup(row) + (child.describe(),)
    else:
      timers[name] = ROWS[row].build() + (probes.onednn_on(),)
      timers[name][0](FLAGS.warmup)
  return timers


def _run_windows(timers, peak_samples):
  """Times --windows windows of --steps steps of every row, the rows
  taking turns, a window each, so that drift slows all alike; the matmul
  peaks take their turn after each window, appended to peak_samples, so
  that the shares of the peak are of the same drift too.

  Returns:
    {table row: examples/sec of each window}.
  """
  rates = {name: [] for name in timers}
  for window in range(FLAGS.windows):
    for name, (timer, examples_per_step, _, _) in timers.items():
      rates[name].append(FLAGS.steps * examples_per_step /
                         timer(FLAGS.steps))
    peak_samples.append(_peaks())
    print('window %d of %d: %s; float32 peak %.1f GFLOP/s' % (
        window + 1, FLAGS.windows, ', '.join(
            '%s %.1f' % (name, rates[name][-1]) for name in timers),
        peak_samples[-1]['float32']))
  return rates


def _table_line(name, timer, rates, peaks, flops):
  """Returns one row's cells: name, what, devices, oneDNN, median, min,
  max, GFLOP/s against its peak, the projected 100K steps."""
  row = name.split('/')[0]
  _, examples_per_step, devices, onednn = timer
  median = np.median(rates)
  gflops = projected = ''
  if ROWS[row].kind in TRAINING:
    rate = median * flops / 1e9
    gflops = '%.1f (%.0f%% of %s)' % (
        rate, 100 * rate / peaks[_precision(row)], _precision(row))
    if 'GPU' in devices:
      projected = '%.1f min' % (
          PROJECTED_STEPS * examples_per_step / median / 60)
  return (name, ROWS[row].what, devices, onednn, median, min(rates),
          max(rates), gflops, projected)


def _print_table(timers, rates, peak_samples, flops):
  """Prints each row's median rate, spread, GFLOP/s and 100K-step time
  (against the median peak), the peaks, then ours / Keras.

  Args:
    timers: {table row: (timer, examples per step, devices, oneDNN)}.
    rates: {table row: examples/sec of each window}.
    peak_samples: a list of {precision: the matmul peak, GFLOP/s}.
    flops: flops of one example's training step.
  """
  peaks = _median_peaks(peak_samples)
  lines = [_table_line(name, timers[name], rates[name], peaks, flops)
           for name in timers]
  for line in lines:
    print('%-21s %-44s %-11s oneDNN %-3s %8.1f examples/sec (%.1f..%.1f) '
          '%s %s' % line)
  print()
  print('CPU class %s; matmul peaks %s GFLOP/s, medians of %d (before the '
        'windows and after each)' % (
            environment.cpu_class(environment.cpu_flags()), ', '.join(
                '%s %.1f (%.1f..%.1f)' % (
                    name, peaks[name],
                    min(sample[name] for sample in peak_samples),
                    max(sample[name] for sample in peak_samples))
                for name in sorted(peaks)), len(peak_samples)))
  print()
  print('| row | what | device | oneDNN | examples/sec (median) | min..max '
        '| GFLOP/s (of its precision\'s peak) | %dK steps |'
        % (PROJECTED_STEPS // 1000))
  print('| --- | --- | --- | --- | ---: | --- | --- | ---: |')
  for line in lines:
    print('| %s | %s | %s | %s | %.1f | %.1f..%.1f | %s | %s |' % line)
  medians = {line[0]: line[4] for line in lines}
  for ours in [row for row in ROWS if ROWS[row].kind == OURS]:
    for keras in sorted(medians):
      if ours in medians and ROWS[keras.split('/')[0]].kind == KERAS:
        print('%s / %s = %.2fx' % (ours, keras,
                                   medians[ours] / medians[keras]))


def _print_header(peaks, flops):
  """Prints the run's settings and what its figures are measured against."""
  print('batch_size %d per tower, warm-up %d steps, %d windows of %d steps'
        % (FLAGS.batch_size, FLAGS.warmup, FLAGS.windows, FLAGS.steps))
  print('matmul peak %.1f GFLOP/s (%s %dx%d)%s; training step %.1f MFLOP '
        'per example' % (peaks['float32'], probes.float32_matmuls(),
                         probes.MATMUL_SIZE, probes.MATMUL_SIZE, ''.join(
                             ', %s %.1f' % item for item in sorted(
                                 peaks.items()) if item[0] != 'float32'),
                         flops / 1e6))
  print('CPU class %s; oneDNN %s in this process (our rows)' % (
      environment.cpu_class(environment.cpu_flags()), probes.onednn_on()))
  print(probes.gpus_line())
  # That the bfloat16 rows will be slow here, where they will (as
  # --use_bf16 says it for the scripts).
  if any('--use_bf16' in ROWS[row].flags() for row in FLAGS.rows):
    notice = hardware.precision_notice(use_fp16=False, use_bf16=True)
    if notice and not FLAGS.use_bf16:
      print(notice)


def _profile_train(steps):
  """Traces steps of the train row, after --warmup untimed ones, its ops
  run one at a time (each still on all cores), so that their times add up
  to the step's; returns profiler.profile_steps' result."""
  def one_op_at_a_time():
    train_op, examples, config, init = _single_tower()
    config.inter_op_parallelism_threads = 1
    config.use_per_session_threads = True  # Not the pool the rows share.
    return train_op, examples, config, init

  sess, train_op, _ = _graph_session(one_op_at_a_time)
  with sess:
    for _ in range(FLAGS.warmup):
      sess.run(train_op)
    return profiler.profile_steps(sess, train_op, steps)


def main(argv=None):  # pylint: disable=unused-argument
  if FLAGS.row_process:  # A child of another benchmark.py: rows it asks.
    row_process.serve({row: ROWS[row].build for row in ROWS}, FLAGS.warmup,
                      probes.onednn_on)
    return
  _check_rows()
  cifar10.maybe_download_and_extract()
  peak_samples = [_peaks()]
  flops = train_flops_per_example()
  _print_header(peak_samples[0], flops)
  table_rows = _table_rows()
  children = _start_children(table_rows)
  try:
    timers = _set_up_rows(table_rows, children)
    rates = _run_windows(timers, peak_samples)
  finally:
    for child in children.values():
      child.close()
  print()
  _print_table(timers, rates, peak_samples, flops)
  if FLAGS.profile_steps:
    profiler.print_profile(_profile_train(FLAGS.profile_steps),
                           FLAGS.profile_steps)


if __name__ == '__main__':
  cli.run_main(main)
