"""Measures training speed against Keras, the input pipeline and eval.

One run, one data set, one batch size. Every row is set up first and
runs --warmup untimed steps; then the rows take turns, one window of
--steps steps each, --windows times over, so that a machine whose speed
drifts slows every row alike (machinery/timing.py). Each row reports the
median examples/sec over its windows with their spread (min..max).

Rows (ROWS below):
  train            cifar10_train.py's train_op in a plain session
  train_bf16       the same with --use_bf16
  train_held       the same step on one distorted batch read once and held
                   in memory: the input pipeline does no work beside the
                   step, so train / train_held is what feeding costs it
  multi1           cifar10_multi_gpu_train.py's train_op, 1 tower
  multi2           cifar10_multi_gpu_train.py's train_op, 2 towers
  multi2_quiet     the same with --nogradient_noise_scale: multi2 /
                   multi2_quiet is what measuring the noise scale costs
  split            cifar10_multi_gpu_train.py's train_op, the batch split
                   over 2 towers of --batch_size/2: the same examples and
                   update per step as train
  split_bf16       the same with --use_bf16: the same examples and update
                   per step as train_bf16
  input            the distorted input pipeline alone
  eval             cifar10_eval.py's forward pass and in_top_k
  keras_fit        the same model in Keras, model.fit on a tf.data
                   pipeline with the same preprocessing (cifar10_keras.py)
  keras_loop       the same Keras model, a custom tf.function train step
  keras_fit_bf16   keras_fit under Keras' mixed_bfloat16 policy
  keras_loop_bf16  keras_loop under mixed_bfloat16

Training rows also show GFLOP/s (train_flops_per_example) against
the peak of a 4096x4096 matmul (--matmul_size) in the row's own precision
(float32, bfloat16, float16), measured in the same run before the windows
and after each (the median; a CPU's peak drifts as its rows' speeds do;
machinery/probes.py), and the table shows ours / Keras. The Keras rows run
twice, each in a child process of its own (TensorFlow reads the setting
once, as it starts): with TensorFlow's default oneDNN setting on this CPU
(/tf_default) and with oneDNN on (/onednn_on), as our rows run;
--keras_onednn chooses. A row that needs other flags than the command
line's (bfloat16, half the batch) runs in a child process
started with them (machinery/row_process.py). The CPU's class (AVX2,
AVX-512, AVX512_BF16, AMX) heads the table. With --profile_steps, the train
row's op time per step follows, by layer and op (machinery/profiler.py).
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

import cifar10
import cifar10_eval
import cifar10_keras
import cifar10_multi_gpu_train as multi
import cifar10_train
from machinery import cli
from machinery import environment
from machinery import errors
from machinery import hardware
from machinery import options
from machinery import probes
from machinery import profiler
from machinery import recipe as recipes
from machinery import row_process
from machinery import timing
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
TRAINING = (OURS, TOWERS, KERAS)

# The GPU rows show how long this many steps would take at their speed.
PROJECTED_STEPS = 100000

KERAS_ONEDNN = ['tf_default', 'onednn_on']

# A row: what it times (for the table), its kind, what builds it (BUILDS),
# its towers, its precision, and whether its towers split --batch_size
# (the same examples a step as one tower).
Row = collections.namedtuple('Row', ['what', 'kind', 'build', 'towers',
                                     'precision', 'split'])
F32, BF16 = 'float32', 'bfloat16'
ROWS = collections.OrderedDict([
    ('train', Row('cifar10_train.py graph, 1 tower', OURS, 'train', 1, F32,
                  False)),
    ('train_bf16', Row('cifar10_train.py graph, 1 tower, --use_bf16', OURS,
                       'train', 1, BF16, False)),
    ('train_held', Row('cifar10_train.py graph, 1 tower, one held batch',
                       TOWERS, 'held', 1, F32, False)),
    ('multi1', Row('cifar10_multi_gpu_train.py graph, 1 tower', TOWERS,
                   'towers', 1, F32, False)),
    ('multi2', Row('cifar10_multi_gpu_train.py graph, 2 towers', TOWERS,
                   'towers', 2, F32, False)),
    ('multi2_quiet', Row('2 towers, --nogradient_noise_scale', TOWERS,
                         'towers_quiet', 2, F32, False)),
    ('split', Row('cifar10_multi_gpu_train.py graph, 2 towers of half the '
                  'batch', OURS, 'towers', 2, F32, True)),
    ('split_bf16', Row('cifar10_multi_gpu_train.py graph, 2 towers of half '
                       'the batch, --use_bf16', OURS, 'towers', 2, BF16, True)),
    ('input', Row('input pipeline alone (distorted batches)', PIPELINE,
                  'input', 1, F32, False)),
    ('eval', Row('eval forward pass + in_top_k', PIPELINE, 'eval', 1, F32,
                 False)),
    ('keras_fit', Row('Keras model.fit, same model and data', KERAS,
                      'keras_fit', 1, F32, False)),
    ('keras_loop', Row('Keras model, custom tf.function step', KERAS,
                       'keras_loop', 1, F32, False)),
    ('keras_fit_bf16', Row('Keras model.fit, mixed_bfloat16', KERAS,
                           'keras_fit', 1, BF16, False)),
    ('keras_loop_bf16', Row('Keras custom step, mixed_bfloat16', KERAS,
                            'keras_loop', 1, BF16, False)),
])

flags.DEFINE_list('rows', list(ROWS),
                  'Rows to run, from %s.' % ', '.join(ROWS))
flags.DEFINE_integer('steps', 50, 'Steps per timed window.', lower_bound=1)
flags.DEFINE_integer('windows', 5, 'Timed windows per row.', lower_bound=1)
flags.DEFINE_integer('warmup', 20, 'Untimed steps before the windows.',
                     lower_bound=0)
flags.DEFINE_enum('keras_jit_compile', 'auto', ['auto', 'true', 'false'],
                  'jit_compile of the Keras rows (auto: Keras decides; it '
                  'compiles nothing on machines without GPUs).')
flags.DEFINE_integer('matmul_size', probes.MATMUL_SIZE,
                     'Size of the square matmul whose GFLOP/s is the peak '
                     'the training rows are a share of. A smaller one is '
                     'quicker to measure (bfloat16 takes some 18 s each '
                     'time at 4096 on CPUs without bfloat16 units) and '
                     'peaks lower.', lower_bound=64)
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


# What the rows are built with: the flags' values, read once (setup()).
Setup = collections.namedtuple('Setup', [
    'data_dir', 'batch_size', 'opts', 'variable_update', 'noise_scale',
    'keras_rate', 'keras_jit_compile'])


def setup():
  """Returns the Setup the command line asks for."""
  return Setup(FLAGS.data_dir, FLAGS.batch_size, options.from_flags(),
               FLAGS.variable_update, FLAGS.gradient_noise_scale,
               FLAGS.initial_learning_rate,
               {'auto': 'auto', 'true': True,
                'false': False}[FLAGS.keras_jit_compile])


def train_flops_per_example():
  """Counts the flops of the convolutions and matmuls of one example's
  training step: forward, plus the gradients of every weight and of every
  layer's input except the images, 2 flops per multiply-add (the rows set
  a step's speed against the machine's peak with it).

  Returns:
    The flop count (about 105 million).
  """
  size = cifar10.IMAGE_SIZE
  conv1 = size * size * (5 * 5 * 3) * 64
  conv2 = (size // 2) ** 2 * (5 * 5 * 64) * 64
  dense = 2304 * 384 + 384 * 192 + 192 * cifar10.NUM_CLASSES
  forward = conv1 + conv2 + dense
  backward = 2 * forward - conv1
  return 2 * (forward + backward)


# --- The rows' steps: each returns (fetch, examples per step, session
# config or None, local init op or None), built in a graph of its own. ---


def _train_step(batch, how):
  """cifar10_train.py's step on a batch, as the Setup how says."""
  train_op, _, _ = cifar10_train.build_train_op([batch], [''],
                                                recipes.TUTORIAL, how.opts)
  return train_op, how.batch_size, hardware.session_config(), None


def _pipeline_batch(how):
  """A batch of the distorted input pipeline, on the CPU."""
  with tf.device('/cpu:0'):
    return cifar10.distorted_inputs(how.data_dir, how.batch_size, how.opts)


def _held_batch(how):
  """A batch of the pipeline read once, as the variables are initialized,
  then held in memory on the CPU, where the pipeline's batches are."""
  images, labels = _pipeline_batch(how)
  return (tf1.get_local_variable('held_images', initializer=images),
          tf1.get_local_variable('held_labels', initializer=labels))


def _towers_step(row, how, noise_scale=True):
  """cifar10_multi_gpu_train.py's step on the row's towers: with fewer GPUs
  than towers on virtual GPUs; without a GPU, as the trainer runs by
  default, every tower on /cpu:0. noise_scale=False builds it as
  --nogradient_noise_scale does, in this process."""
  train_op, _, scaffold, config = multi.build_graph(
      how.data_dir, how.batch_size, row.towers,
      bool(tf.config.list_physical_devices('GPU')), how.variable_update,
      recipes.TUTORIAL, how.opts, how.noise_scale and noise_scale)
  return (train_op, how.batch_size * row.towers, config,
          scaffold.local_init_op)


def _eval_step(how):
  """The evaluator's forward pass and top-1 check."""
  return (cifar10_eval.correct_predictions(
      True, how.data_dir, how.batch_size, how.opts), how.batch_size, None,
          None)


GRAPH_STEPS = {
    'train': lambda row, how: _train_step(_pipeline_batch(how), how),
    'held': lambda row, how: _train_step(_held_batch(how), how),
    'towers': _towers_step,
    'towers_quiet': lambda row, how: _towers_step(row, how, noise_scale=False),
    'input': lambda row, how: (_pipeline_batch(how), how.batch_size, None,
                               None),
    'eval': lambda row, how: _eval_step(how),
}


def _graph_session(step):
  """Returns (session, fetch, examples per step) of step()'s graph, its
  variables initialized."""
  graph = tf.Graph()
  with graph.as_default():
    fetch, examples_per_step, config, local_init = step()
    inits = [tf1.global_variables_initializer(),
             local_init or tf1.local_variables_initializer()]
  sess = tf1.Session(graph=graph,
                     config=config or hardware.session_config())
  for init in inits:
    sess.run(init)
  return sess, fetch, examples_per_step


def build_row(name, how):
  """Builds a row as the Setup how says; returns (timer, examples per step,
  the devices its heaviest ops ran on)."""
  row = ROWS[name]
  if row.kind == KERAS:
    timer, device = {'keras_fit': cifar10_keras.fit_timer,
                     'keras_loop': cifar10_keras.loop_timer}[row.build](
                         'mixed_bfloat16' if row.precision == BF16
                         else 'float32', how.data_dir, how.batch_size,
                         how.keras_rate, how.keras_jit_compile)
    return timer, how.batch_size, device
  sess, fetch, examples_per_step = _graph_session(
      lambda: GRAPH_STEPS[row.build](row, how))
  devices = probes.devices_ran_on(sess, fetch)
  return timing.stepper(lambda: sess.run(fetch)), examples_per_step, devices


# --- What each row runs with, and in which process. ---


def _row_flags(name):
  """The flags a row needs beyond the command line's: its precision, half
  the batch."""
  row = ROWS[name]
  bf16 = ('--use_bf16',) if (row.precision == BF16 and row.kind != KERAS and
                             not FLAGS.use_bf16) else ()
  half = ('--batch_size=%d' % (FLAGS.batch_size // 2),) if row.split else ()
  return bf16 + half


def _precision(name):
  """Names the precision a training row multiplies in."""
  row = ROWS[name]
  if row.kind != KERAS and FLAGS.use_fp16:
    return 'float16'
  return BF16 if row.precision == BF16 or (
      row.kind != KERAS and FLAGS.use_bf16) else F32


def _table_rows():
  """Returns the rows as the table names them, with the process each runs
  in: {table row: None for this one, or (oneDNN setting or None, extra
  flags) of a child}. A Keras row runs once per --keras_onednn setting
  (keras_fit/tf_default, keras_fit/onednn_on)."""
  names = collections.OrderedDict()
  for row in FLAGS.rows:
    if ROWS[row].kind == KERAS:
      for setting in FLAGS.keras_onednn:
        names[row + '/' + setting] = (setting, ())
    else:
      names[row] = (None, _row_flags(row)) if _row_flags(row) else None
  return names


def _check_rows():
  """Raises errors.UsageError for --rows the other flags cannot run."""
  unknown = set(FLAGS.rows) - set(ROWS)
  if unknown:
    raise errors.UsageError(
        'Unknown --rows %s; choose from %s.'
        % (','.join(sorted(unknown)), ','.join(ROWS)))
  bf16_rows = {row for row in FLAGS.rows
               if ROWS[row].precision == BF16 and ROWS[row].kind != KERAS}
  if FLAGS.use_fp16 and bf16_rows:
    raise errors.UsageError(
        '--use_fp16 cannot run the bfloat16 rows (%s): leave them out of '
        '--rows.' % ','.join(sorted(bf16_rows)))
  unknown = set(FLAGS.keras_onednn) - set(KERAS_ONEDNN)
  if unknown or not FLAGS.keras_onednn:
    raise errors.UsageError(
        'Unknown --keras_onednn %s; choose one or both of %s.'
        % (','.join(sorted(unknown)), ','.join(KERAS_ONEDNN)))
  split_rows = {row for row in FLAGS.rows if ROWS[row].split}
  if split_rows and FLAGS.batch_size % 2:
    raise errors.UsageError(
        'The %s %s --batch_size=%d over 2 towers: give an even '
        '--batch_size.' % (' and '.join(sorted(split_rows)),
                           'rows split' if len(split_rows) > 1
                           else 'row splits', FLAGS.batch_size))


def _set_up_rows(table_rows, children, how, warmup):
  """Builds every row (ours as the Setup how says, or in a child) and runs
  its warmup steps.

  Returns:
    {table row: (timer, examples per step, devices, oneDNN)}.
  """
  timers = collections.OrderedDict()
  for name, process in table_rows.items():
    print('setting up %s, %d warm-up steps' % (name, warmup))
    row = name.partition('/')[0]
    if process:
      child = children[process]
      timers[name] = child.setup(row) + (child.describe(),)
    else:
      timers[name] = build_row(row, how) + (probes.onednn_on(),)
      timers[name][0](warmup)
  return timers


# --- The table. ---


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
  """Prints the peaks, then each row's median rate, spread, GFLOP/s and
  100K-step time (against the median peak), then ours / Keras."""
  peaks, spreads = probes.median_peaks(peak_samples)
  print('CPU class %s; matmul peaks %s GFLOP/s, medians of %d (before the '
        'windows and after each)' % (
            environment.cpu_class(environment.cpu_flags()), ', '.join(
                '%s %.1f (%.1f..%.1f)' % ((name, peaks[name]) + spreads[name])
                for name in sorted(peaks)), len(peak_samples)))
  print()
  print('| row | what | device | oneDNN | examples/sec (median) | min..max '
        '| GFLOP/s (of its precision\'s peak) | %dK steps |'
        % (PROJECTED_STEPS // 1000))
  print('| --- | --- | --- | --- | ---: | --- | --- | ---: |')
  lines = [_table_line(name, timers[name], rates[name], peaks, flops)
           for name in timers]
  for line in lines:
    print('| %s | %s | %s | %s | %.1f | %.1f..%.1f | %s | %s |' % line)
  medians = {line[0]: line[4] for line in lines}
  kind = {name: ROWS[name.split('/')[0]].kind for name in medians}
  for ours in [row for row in medians if kind[row] == OURS]:
    for keras in [row for row in sorted(medians) if kind[row] == KERAS]:
      print('%s / %s = %.2fx' % (ours, keras,
                                 medians[ours] / medians[keras]))


def _print_header(peaks, flops):
  """Prints the run's settings and what its figures are measured against."""
  print('batch_size %d per tower, warm-up %d steps, %d windows of %d steps'
        % (FLAGS.batch_size, FLAGS.warmup, FLAGS.windows, FLAGS.steps))
  print('matmul peak %.1f GFLOP/s (%s %dx%d)%s; training step %.1f MFLOP '
        'per example' % (peaks['float32'], probes.float32_matmuls(),
                         FLAGS.matmul_size, FLAGS.matmul_size, ''.join(
                             ', %s %.1f' % item for item in sorted(
                                 peaks.items()) if item[0] != 'float32'),
                         flops / 1e6))
  print('CPU class %s; oneDNN %s in this process (our rows)' % (
      environment.cpu_class(environment.cpu_flags()), probes.onednn_on()))
  print(probes.gpus_line())
  # That the bfloat16 rows will be slow here, where they will (as
  # --use_bf16 says it for the scripts).
  if any(ROWS[row].precision == BF16 for row in FLAGS.rows):
    notice = hardware.precision_notice(use_fp16=False, use_bf16=True)
    if notice and not FLAGS.use_bf16:
      print(notice)


def _profile_train(steps, warmup, how):
  """Traces steps of the train row, after warmup untimed ones, its ops
  run one at a time (each still on all cores), so that their times add up
  to the step's; returns profiler.profile_steps' result."""
  def one_op_at_a_time():
    train_op, examples, config, init = _train_step(_pipeline_batch(how), how)
    config.inter_op_parallelism_threads = 1
    config.use_per_session_threads = True  # Not the pool the rows share.
    return train_op, examples, config, init

  sess, train_op, _ = _graph_session(one_op_at_a_time)
  with sess:
    for _ in range(warmup):
      sess.run(train_op)
    return profiler.profile_steps(sess, train_op, steps)


def main(argv=None):  # pylint: disable=unused-argument
  hardware.grow_gpu_memory()  # The rows and the child processes share a GPU.
  how = setup()
  if FLAGS.row_process:  # A child of another benchmark.py: rows it asks.
    row_process.serve({row: lambda row=row: build_row(row, how)
                       for row in ROWS}, FLAGS.warmup, probes.onednn_on)
    return
  _check_rows()
  cifar10.maybe_download_and_extract(FLAGS.data_dir, FLAGS.data_url,
                                     FLAGS.data_md5)
  precisions = {F32} | {_precision(row) for row in FLAGS.rows
                        if ROWS[row].kind in TRAINING}
  peak_samples = [probes.peaks(precisions, FLAGS.matmul_size)]
  flops = train_flops_per_example()
  _print_header(peak_samples[0], flops)
  table_rows = _table_rows()
  children = row_process.start_children(
      __file__, [key for key in table_rows.values() if key],
      FLAGS.flags_into_string())
  try:
    timers = _set_up_rows(table_rows, children, how, FLAGS.warmup)

    def after_each(window, rates):
      peak_samples.append(probes.peaks(precisions, FLAGS.matmul_size))
      print('window %d of %d: %s; float32 peak %.1f GFLOP/s' % (
          window + 1, FLAGS.windows, ', '.join(
              '%s %.1f' % (name, rates[name][-1]) for name in timers),
          peak_samples[-1]['float32']))
    rates = timing.in_turns(
        {name: timer[:2] for name, timer in timers.items()}, FLAGS.windows,
        FLAGS.steps, after_each)
  finally:
    for child in children.values():
      child.close()
  print()
  _print_table(timers, rates, peak_samples, flops)
  if FLAGS.profile_steps:
    profiler.print_profile(_profile_train(FLAGS.profile_steps, FLAGS.warmup,
                                          how),
                           FLAGS.profile_steps)


if __name__ == '__main__':
  cli.run_main(main)
