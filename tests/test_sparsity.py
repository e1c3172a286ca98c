"""docs/sparsity.py: a run's learning rate and ReLU sparsity from its
event files, a row every --every steps."""

import os
import subprocess
import sys

import tensorflow as tf

from conftest import REPO, script_env


def write_events(train_dir, rows):
  """Writes scalar summaries {step: {tag: value}} as a trainer's
  tf.compat.v1 summaries are written."""
  tf1 = tf.compat.v1
  with tf.Graph().as_default():
    writer = tf1.summary.FileWriter(str(train_dir))
    for step, values in rows.items():
      writer.add_summary(tf1.Summary(value=[
          tf1.Summary.Value(tag=tag, simple_value=value)
          for tag, value in values.items()]), step)
    writer.close()


def run_sparsity(*args):
  return subprocess.run(
      [sys.executable, os.path.join(REPO, 'docs', 'sparsity.py')] +
      list(args), capture_output=True, text=True, timeout=120,
      env=script_env())


def test_rows_every_n_steps_with_rate_and_layers(tmp_path):
  write_events(tmp_path, {
      1: {'learning_rate': 0.1, 'conv2/sparsity': 0.41, 'loss': 4.6},
      101: {'learning_rate': 0.4, 'conv2/sparsity': 0.84,
            'local4/sparsity': 0.62},
      201: {'learning_rate': 0.8, 'conv2/sparsity': 0.98},
      301: {'learning_rate': 0.8, 'conv2/sparsity': 0.99}})
  result = run_sparsity('--train_dir=%s' % tmp_path, '--every=200')
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stdout.splitlines()
  assert lines[0] == '| step | learning rate | conv1 | conv2 | local3 | local4 |'
  assert lines[1].count('---:') == 6
  # Steps 1 and 201: the first of each 200; the missing tags as '-'.
  assert lines[2:] == ['| 1 | 0.100 | - | 0.410 | - | - |',
                       '| 201 | 0.800 | - | 0.980 | - | - |']


def test_a_directory_without_events_is_one_error_line(tmp_path):
  result = run_sparsity('--train_dir=%s' % tmp_path)
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
      'Error: no event files in --train_dir=%s: give the directory a '
      'trainer wrote.' % tmp_path)


def test_a_lars_run_gains_its_trust_ratios(tmp_path):
  write_events(tmp_path, {
      1: {'learning_rate': 0.005, 'conv2/sparsity': 0.41,
          'trust_ratio/conv2/weights': 10.25,
          'trust_ratio/softmax_linear/weights': 0.014},
      201: {'learning_rate': 0.04, 'conv2/sparsity': 0.75,
            'trust_ratio/conv2/weights': 61.5}})
  result = run_sparsity('--train_dir=%s' % tmp_path, '--every=200')
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stdout.splitlines()
  # Only the layers whose ratios the run summarized get a column.
  assert lines[0] == ('| step | learning rate | conv1 | conv2 | local3 | '
                      'local4 | conv2 ratio | softmax_linear ratio |')
  assert lines[1].count('---:') == 8
  assert lines[2:] == ['| 1 | 0.005 | - | 0.410 | - | - | 10.250 | 0.014 |',
                       '| 201 | 0.040 | - | 0.750 | - | - | 61.500 | - |']
