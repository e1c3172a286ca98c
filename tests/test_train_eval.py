"""End to end: the single-tower trainer and the evaluator as a user runs them."""

import glob
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import cifar10
from conftest import (REPO, STEP_LINE, checkpoint_step, error_lines,
                      run_script)

tf1 = tf.compat.v1


def _event_tags(directory):
  tags = {}
  for path in glob.glob(os.path.join(directory, 'events.out.tfevents.*')):
    for event in tf1.train.summary_iterator(path):
      for value in event.summary.value:
        tags.setdefault(value.tag, []).append((event.step, value))
  return tags


def _train(data_dir, train_dir, *args):
  result = run_script('cifar10_train.py', '--data_dir=' + data_dir,
                      '--train_dir=' + train_dir, '--batch_size=32', *args)
  assert result.returncode == 0, result.stderr[-3000:]
  return result


def test_train_resume_and_evaluate(real_data_dir, tmp_path):
  train_dir = str(tmp_path / 'train')
  first = _train(real_data_dir, train_dir, '--max_steps=40')
  steps = [int(m.group(1)) for m in STEP_LINE.finditer(first.stdout)]
  assert steps == [0, 10, 20, 30], first.stdout
  assert 'Filling queue with 20000 CIFAR images' in first.stdout
  assert checkpoint_step(train_dir) == 40
  events_before = set(glob.glob(os.path.join(train_dir, 'events.*')))

  second = _train(real_data_dir, train_dir, '--max_steps=60')
  assert 'Resuming from' in second.stdout
  steps = [int(m.group(1)) for m in STEP_LINE.finditer(second.stdout)]
  assert steps == [40, 50], second.stdout
  assert checkpoint_step(train_dir) == 60
  assert events_before < set(glob.glob(os.path.join(train_dir, 'events.*')))

  tags = _event_tags(train_dir)
  for tag in ['learning_rate', 'total_loss', 'total_loss (raw)',
              'cross_entropy', 'local3/weight_loss', 'conv1/sparsity',
              'conv2/activations', 'softmax_linear/sparsity',
              'local4/weights', 'local4/weights/gradients',
              'images/image/0']:
    assert tag in tags, sorted(tags)

  eval_dir = str(tmp_path / 'eval')
  result = run_script('cifar10_eval.py', '--data_dir=' + real_data_dir,
                      '--checkpoint_dir=' + train_dir,
                      '--eval_dir=' + eval_dir, '--run_once',
                      '--num_examples=1000', '--batch_size=300')
  assert result.returncode == 0, result.stderr[-3000:]
  lines = [l for l in result.stdout.splitlines() if 'precision @ 1' in l]
  assert len(lines) == 1
  precision = float(lines[0].split('= ')[1])
  assert 0.0 <= precision <= 1.0
  # 1000 examples at batch 300 is 4 batches; only the first 1000 count, so
  # the precision is a multiple of 1/1000.
  assert abs(precision * 1000 - round(precision * 1000)) < 1e-6
  precision_events = _event_tags(eval_dir)['Precision @ 1']
  assert [step for step, _ in precision_events] == [60]
  assert abs(precision_events[0][1].simple_value - precision) < 1e-3


def test_eval_counts_exactly_num_examples(real_data_dir, tmp_path):
  """The evaluator's precision equals a direct count over the first N images."""
  sys.path.insert(0, REPO)
  from absl.testing import flagsaver  # pylint: disable=g-import-not-at-top
  train_dir = str(tmp_path / 'train')
  _train(real_data_dir, train_dir, '--max_steps=20')
  result = run_script('cifar10_eval.py', '--data_dir=' + real_data_dir,
                      '--checkpoint_dir=' + train_dir,
                      '--eval_dir=' + str(tmp_path / 'eval'), '--run_once',
                      '--num_examples=250', '--batch_size=100')
  assert result.returncode == 0, result.stderr[-3000:]
  reported = float(result.stdout.split('precision @ 1 = ')[1].split()[0])

  with flagsaver.flagsaver(data_dir=real_data_dir, batch_size=250), \
      tf.Graph().as_default():
    images, labels = cifar10.inputs(eval_data=True)
    correct = tf1.nn.in_top_k(cifar10.inference(images), labels, 1)
    ema = tf1.train.ExponentialMovingAverage(cifar10.MOVING_AVERAGE_DECAY)
    saver = tf1.train.Saver(ema.variables_to_restore())
    with tf1.Session() as sess:
      saver.restore(sess, tf1.train.latest_checkpoint(train_dir))
      expected = np.mean(sess.run(correct))
  assert abs(reported - expected) < 1e-3 + 1e-9


def test_eval_without_checkpoint_is_one_line(real_data_dir, tmp_path):
  empty = str(tmp_path / 'nothing_here')
  result = run_script('cifar10_eval.py', '--data_dir=' + real_data_dir,
                      '--checkpoint_dir=' + empty, '--run_once',
                      '--eval_dir=' + str(tmp_path / 'eval'))
  assert result.returncode == 1
  assert error_lines(result.stderr) == [
      'Error: No checkpoint file found in %s.' % empty]
  assert 'Traceback' not in result.stderr


def test_loss_falls_over_a_few_hundred_steps(real_data_dir, tmp_path):
  result = _train(real_data_dir, str(tmp_path / 'train'), '--max_steps=300',
                  '--batch_size=64', '--log_frequency=20')
  losses = [float(m.group(2)) for m in STEP_LINE.finditer(result.stdout)]
  assert len(losses) == 15
  assert 4.6 < losses[0] < 4.75
  assert np.mean(losses[-3:]) < losses[0] - 0.6, losses


def test_sigterm_saves_checkpoint_at_current_step(real_data_dir, tmp_path):
  train_dir = str(tmp_path / 'train')
  proc = subprocess.Popen(
      [sys.executable, os.path.join(REPO, 'cifar10_train.py'),
       '--data_dir=' + real_data_dir, '--train_dir=' + train_dir,
       '--batch_size=16', '--log_frequency=1', '--max_steps=100000'],
      cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  seen = []
  for line in proc.stdout:
    match = STEP_LINE.match(line.strip())
    if match:
      seen.append(int(match.group(1)))
      if len(seen) == 25:
        proc.send_signal(signal.SIGTERM)
        break
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 0, err[-3000:]
  steps = seen + [int(m.group(1)) for m in STEP_LINE.finditer(out)]
  assert 'Stopped by signal %d' % signal.SIGTERM in out
  # The checkpoint holds every step that ran: the last logged one + 1.
  assert checkpoint_step(train_dir) == steps[-1] + 1 >= 25


def test_nan_loss_stops_with_one_line_and_keeps_checkpoint(real_data_dir,
                                                           tmp_path):
  train_dir = str(tmp_path / 'train')
  result = run_script('cifar10_train.py', '--data_dir=' + real_data_dir,
                      '--train_dir=' + train_dir, '--batch_size=16',
                      '--max_steps=200', '--initial_learning_rate=1e5',
                      '--save_checkpoint_steps=1')
  assert result.returncode == 1
  lines = error_lines(result.stderr)
  assert len(lines) == 1 and 'Traceback' not in result.stderr
  assert re.match(r'Error: Model diverged with loss = (nan|inf) at step \d+\. ',
                  lines[0]), lines[0]
  assert 'Lower --initial_learning_rate (now 100000)' in lines[0]
  kept = tf.train.latest_checkpoint(train_dir)
  assert kept and kept in lines[0]
  reader = tf.train.load_checkpoint(kept)
  for name in reader.get_variable_to_shape_map():
    value = reader.get_tensor(name)
    if np.issubdtype(np.asarray(value).dtype, np.floating):
      assert np.all(np.isfinite(value)), name


def _save_other_checkpoint(directory, shapes):
  """Saves a checkpoint of variables with the given {name: shape}."""
  with tf.Graph().as_default():
    global_step = tf1.train.get_or_create_global_step()
    for name, shape in shapes.items():
      tf1.get_variable(name, shape)
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      tf1.train.Saver().save(sess, os.path.join(directory, 'model.ckpt'),
                             global_step=global_step)


def _model_checkpoint_shapes():
  """{name in the checkpoint: shape} of what the evaluator restores."""
  with tf.Graph().as_default():
    cifar10.inference(tf.zeros([1, 24, 24, 3]))
    names = tf1.train.ExponentialMovingAverage(
        cifar10.MOVING_AVERAGE_DECAY).variables_to_restore()
    return {name: var.shape.as_list() for name, var in names.items()}


@pytest.mark.parametrize('other', ['names', 'shapes'])
def test_eval_of_another_models_checkpoint_is_one_line(fake_data_dir,
                                                       tmp_path, other):
  checkpoint_dir = str(tmp_path / 'other')
  if other == 'names':
    shapes = {'dense/kernel': [10, 10]}
    wrong = 'it has no conv1/biases/ExponentialMovingAverage'
  else:
    shapes = _model_checkpoint_shapes()
    name = 'local3/weights/ExponentialMovingAverage'
    assert shapes[name] == [2304, 384]
    shapes[name] = [4096, 384]
    wrong = '%s is [4096, 384] there, [2304, 384] here' % name
  _save_other_checkpoint(checkpoint_dir, shapes)
  for run_once in ('--run_once', '--norun_once'):
    result = run_script('cifar10_eval.py', run_once,
                        '--data_dir=' + fake_data_dir,
                        '--checkpoint_dir=' + checkpoint_dir,
                        '--eval_dir=' + str(tmp_path / 'eval'), timeout=120)
    assert result.returncode == 1
    assert error_lines(result.stderr) == [
        "Error: Checkpoint %s/model.ckpt-0 is not this model's: %s. Point "
        "--checkpoint_dir at a --train_dir of this project's trainers."
        % (checkpoint_dir, wrong)]


def test_bf16_checkpoint_is_float32_evaluates_and_resumes_either_way(
    fake_data_dir, tmp_path):
  train_dir = str(tmp_path / 'train')
  args = ['--data_dir=' + fake_data_dir, '--train_dir=' + train_dir,
          '--batch_size=8']
  first = run_script('cifar10_train.py', '--use_bf16', '--max_steps=10',
                     *args)
  assert first.returncode == 0, first.stderr[-2000:]
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(train_dir))
  dtypes = reader.get_variable_to_dtype_map()
  assert dtypes.pop('global_step') == tf.int64
  assert set(dtypes.values()) == {tf.float32}
  assert 'conv1/weights/ExponentialMovingAverage' in dtypes
  for flag in ('--use_bf16', '--nouse_bf16'):
    result = run_script('cifar10_eval.py', flag, '--run_once',
                        '--data_dir=' + fake_data_dir, '--batch_size=8',
                        '--num_examples=16', '--checkpoint_dir=' + train_dir,
                        '--eval_dir=' + str(tmp_path / 'eval'))
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'precision @ 1 = ' in result.stdout
  resumed = run_script('cifar10_train.py', '--max_steps=15', *args)
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert 'Resuming from %s/model.ckpt-10.' % train_dir in resumed.stdout
  assert checkpoint_step(train_dir) == 15
