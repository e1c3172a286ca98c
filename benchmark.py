"""Measures examples/sec of the training graphs, the input pipeline and eval.

Each row builds its graph fresh, runs --warmup steps, then --windows
windows of --steps steps each, and reports the median examples/sec over
the windows with their spread (min..max). Training rows run the same
train_op the trainers run, in a plain session (no hooks).

Usage:
  python benchmark.py --data_dir=/tmp/cifar10_data
  python benchmark.py --rows=train,multi2 --steps=50 --windows=3
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import time

import cifar10  # First: it quiets TensorFlow's start-up logging.
import cifar10_eval
import cifar10_multi_gpu_train as multi
import cifar10_train
import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
flags = tf1.flags
FLAGS = flags.FLAGS

ROWS = ['train', 'multi1', 'multi2', 'input', 'eval']
flags.DEFINE_list('rows', ROWS, 'Rows to run, from %s.' % ', '.join(ROWS))
flags.DEFINE_integer('steps', 100, 'Steps per timed window.', lower_bound=1)
flags.DEFINE_integer('windows', 5, 'Timed windows per row.', lower_bound=1)
flags.DEFINE_integer('warmup', 20, 'Untimed steps before the windows.',
                     lower_bound=0)
flags.adopt_module_key_flags(cifar10)


def _time(fetch, examples_per_step, config=None):
  """Runs fetch in windows; returns the examples/sec of each window."""
  rates = []
  with tf1.Session(config=config) as sess:
    sess.run(tf1.global_variables_initializer())
    for _ in range(FLAGS.warmup):
      sess.run(fetch)
    for _ in range(FLAGS.windows):
      start = time.time()
      for _ in range(FLAGS.steps):
        sess.run(fetch)
      rates.append(FLAGS.steps * examples_per_step / (time.time() - start))
  return rates


def _single_tower():
  train_op, _ = cifar10_train.build_train_op()
  return train_op, FLAGS.batch_size, None


def _multi(num_towers):
  devices, config = multi.tower_devices(num_towers)
  with tf.device('/cpu:0'):
    batches = cifar10.distorted_batches(num_towers)
    train_op, _, _ = multi.build_train_op(batches, devices)
  return train_op, FLAGS.batch_size * num_towers, config


def _input():
  return cifar10.distorted_inputs(), FLAGS.batch_size, None


def _eval():
  return cifar10_eval.correct_predictions(True), FLAGS.batch_size, None


BUILDERS = {
    'train': ('cifar10_train.py graph, 1 tower', _single_tower),
    'multi1': ('cifar10_multi_gpu_train.py graph, 1 tower',
               lambda: _multi(1)),
    'multi2': ('cifar10_multi_gpu_train.py graph, 2 towers',
               lambda: _multi(2)),
    'input': ('input pipeline alone (distorted batches)', _input),
    'eval': ('eval forward pass + in_top_k', _eval),
}


def main(argv=None):  # pylint: disable=unused-argument
  unknown = set(FLAGS.rows) - set(ROWS)
  if unknown:
    raise cifar10.UsageError('Unknown --rows %s; choose from %s.'
                             % (','.join(sorted(unknown)), ','.join(ROWS)))
  cifar10.maybe_download_and_extract()
  print('batch_size %d per tower, warm-up %d steps, %d windows of %d steps'
        % (FLAGS.batch_size, FLAGS.warmup, FLAGS.windows, FLAGS.steps))
  results = []
  for row in FLAGS.rows:
    title, builder = BUILDERS[row]
    with tf.Graph().as_default():
      fetch, examples_per_step, config = builder()
      rates = _time(fetch, examples_per_step, config)
    results.append((row, title, rates))
    print('%-8s %-46s %8.1f examples/sec (%.1f..%.1f)'
          % (row, title, np.median(rates), min(rates), max(rates)))
  print()
  print('| row | what | examples/sec (median) | min..max |')
  print('| --- | --- | ---: | --- |')
  for row, title, rates in results:
    print('| %s | %s | %.1f | %.1f..%.1f |'
          % (row, title, np.median(rates), min(rates), max(rates)))


if __name__ == '__main__':
  cifar10.run_main(main)
