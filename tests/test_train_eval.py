"""End to end: the single-tower trainer and the evaluator as a user runs them."""

import glob
import os
import re
import signal
import sys

from absl.testing import flagsaver
import numpy as np
import pytest
import tensorflow as tf

import cifar10
import cifar10_input
from conftest import (STEP_LINE, checkpoint_step, error_lines, evaluate,
                      make_fake_data, run_script, start_script, train,
                      write_records)

tf1 = tf.compat.v1


def _event_tags(directory):
  tags = {}
  for path in glob.glob(os.path.join(directory, 'events.out.tfevents.*')):
    for event in tf1.train.summary_iterator(path):
      for value in event.summary.value:
        tags.setdefault(value.tag, []).append((event.step, value))
  return tags


def _train(data_dir, train_dir, *args):
  result = train(data_dir, train_dir, '--batch_size=32', *args)
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

  second = _train(real_data_dir, train_dir, '--max_steps=60',
                  '--save_summaries_steps=10')
  assert 'Resuming from %s/model.ckpt-40.' % train_dir in second.stdout
  steps = [int(m.group(1)) for m in STEP_LINE.finditer(second.stdout)]
  assert steps == [40, 50], second.stdout
  assert checkpoint_step(train_dir) == 60
  assert events_before < set(glob.glob(os.path.join(train_dir, 'events.*')))

  tags = _event_tags(train_dir)
  for tag in ['learning_rate', 'total_loss', 'total_loss (raw)',
              'cross_entropy', 'local3/weight_loss', 'conv1/sparsity',
              'conv2/activations', 'softmax_linear/sparsity',
              'local4/weights', 'local4/weights/gradients',
              'images/image/0', 'global_step/sec']:
    assert tag in tags, sorted(tags)
  # Written by the second run, which asked for summaries every 10 steps
  # (the first, at the default of 100, wrote none).
  assert all(40 < step <= 60 for step, _ in tags['global_step/sec'])

  eval_dir = str(tmp_path / 'eval')
  result = evaluate(real_data_dir, train_dir, eval_dir, '--num_examples=1000',
                    '--batch_size=300')
  assert result.returncode == 0, result.stderr[-3000:]
  lines = [l for l in result.stdout.splitlines() if 'precision @ 1' in l]
  assert len(lines) == 1, result.stdout
  precision = float(lines[0].split('= ')[1])
  # What it printed is what it wrote, at the checkpoint's step.
  precision_events = _event_tags(eval_dir)['Precision @ 1']
  assert [step for step, _ in precision_events] == [60]
  assert round(precision_events[0][1].simple_value, 3) == precision


def _save_constant_model(checkpoint_dir, label, step=7):
  """Saves a checkpoint of this model that predicts label for every image.

  Every weight and its moving average is zero, and the last layer's bias
  favours label, so the evaluator's precision is exactly the share of
  that label among the images it counts.
  """
  with tf.Graph().as_default():
    global_step = tf1.train.get_or_create_global_step()
    cifar10.inference(tf.zeros([1, 24, 24, 3]))
    model = tf1.trainable_variables()
    tf1.train.ExponentialMovingAverage(
        cifar10.MOVING_AVERAGE_DECAY).apply(model)
    bias = np.zeros([cifar10.NUM_CLASSES], np.float32)
    bias[label] = 10.0
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      for v in tf1.global_variables():
        if v.dtype.base_dtype == tf.float32:
          name = v.op.name.replace('/ExponentialMovingAverage', '')
          v.load(bias if name == 'softmax_linear/biases' else
                 np.zeros(v.shape.as_list(), np.float32), sess)
      global_step.load(step, sess)
      tf1.train.Saver().save(sess, os.path.join(checkpoint_dir, 'model.ckpt'),
                             global_step=global_step)


def _labels(data_dir, names):
  """The label bytes of binary files, in file order."""
  return np.concatenate([
      np.fromfile(os.path.join(data_dir, cifar10_input.BATCHES_DIR, name),
                  np.uint8).reshape(-1, cifar10_input.RECORD_BYTES)[:, 0]
      for name in names])


def test_eval_counts_exactly_num_examples(real_data_dir, tmp_path):
  """The precision of a model that always says 'airplane' is the share of
  airplanes among exactly the first --num_examples test images."""
  checkpoint_dir = str(tmp_path / 'constant')
  _save_constant_model(checkpoint_dir, label=0)
  labels = _labels(real_data_dir, cifar10_input.TEST_FILES)
  expected = np.mean(labels[:250] == 0)
  # The tutorial counted every image of the 3 batches of 100 that 250
  # take: with these images that is another figure.
  assert abs(np.mean(labels[:300] == 0) - expected) > 0.005
  eval_dir = str(tmp_path / 'eval')
  result = evaluate(real_data_dir, checkpoint_dir, eval_dir,
                    '--num_examples=250', '--batch_size=100')
  assert result.returncode == 0, result.stderr[-3000:]
  assert re.search(r'^\S+ \S+: precision @ 1 = %.3f$' % expected,
                   result.stdout, re.M), (expected, result.stdout)
  (step, value), = _event_tags(eval_dir)['Precision @ 1']
  assert step == 7 and abs(value.simple_value - expected) < 1e-6


@pytest.mark.parametrize('eval_data,expected', [('test', '0.000'),
                                                ('train_eval', '1.000')])
def test_eval_data_chooses_the_files(tmp_path, eval_data, expected):
  """Training images all labelled 0, test images 1, a model that always
  says 0: --eval_data picks which files are counted."""
  data_dir = str(tmp_path / 'data')
  written = make_fake_data(data_dir, records_per_file=10)
  for name, (labels, images) in written.items():
    write_records(os.path.join(data_dir, cifar10_input.BATCHES_DIR, name),
                  [1 if name in cifar10_input.TEST_FILES else 0] * 10,
                  images)
  _save_constant_model(str(tmp_path / 'constant'), label=0)
  result = evaluate(data_dir, str(tmp_path / 'constant'), tmp_path / 'eval',
                    '--eval_data=' + eval_data, '--num_examples=10',
                    '--batch_size=10')
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip().endswith('precision @ 1 = ' + expected)


def test_periodic_eval_evaluates_each_checkpoint_once_and_skips_a_gone_one(
    fake_data_dir, tmp_path, monkeypatch, capsys, parsed_flags):
  import cifar10_eval  # pylint: disable=g-import-not-at-top
  from machinery import checkpoints  # pylint: disable=g-import-not-at-top
  checkpoint_dir = str(tmp_path / 'constant')
  _save_constant_model(checkpoint_dir, label=3)
  real_check = checkpoints.check_checkpoint
  calls = []

  def deleted_at_first(path, var_list):
    calls.append(path)
    if len(calls) == 1:  # The saver removes it while the evaluator reads.
      raise tf.errors.NotFoundError(None, None, 'gone')
    return real_check(path, var_list)

  sleeps = []

  def sleep(seconds):
    sleeps.append(seconds)
    if len(sleeps) == 3:  # A gone one, an evaluation, nothing new: enough.
      raise KeyboardInterrupt
  monkeypatch.setattr(checkpoints, 'check_checkpoint', deleted_at_first)
  monkeypatch.setattr(cifar10_eval.time, 'sleep', sleep)
  eval_dir = str(tmp_path / 'eval')
  with flagsaver.flagsaver(data_dir=fake_data_dir, batch_size=8,
                           checkpoint_dir=checkpoint_dir, eval_dir=eval_dir,
                           num_examples=16, run_once=False,
                           eval_interval_secs=1):
    with pytest.raises(KeyboardInterrupt):
      cifar10_eval.evaluate()
  out = capsys.readouterr().out
  path = os.path.join(checkpoint_dir, 'model.ckpt-7')
  assert ('Checkpoint %s is gone or incomplete; trying again in 1 s.' % path
          in out)
  # Read again on the next look, evaluated once, then left alone.
  assert len(re.findall('precision @ 1 = ', out)) == 1, out
  assert calls == [path, path]
  assert [step for step, _ in _event_tags(eval_dir)['Precision @ 1']] == [7]


def test_eval_without_checkpoint_is_one_line(real_data_dir, tmp_path):
  empty = str(tmp_path / 'nothing_here')
  result = evaluate(real_data_dir, empty, tmp_path / 'eval')
  assert result.returncode == 1
  assert error_lines(result.stderr) == [
      'Error: No checkpoint file found in %s.' % empty]
  assert 'Traceback' not in result.stderr


def test_loss_falls_over_a_few_hundred_steps(real_data_dir, tmp_path):
  result = _train(real_data_dir, str(tmp_path / 'train'), '--max_steps=300',
                  '--batch_size=64', '--log_frequency=20', '--seed=1')
  losses = [float(m.group(2)) for m in STEP_LINE.finditer(result.stdout)]
  # Over seeds 1-10: the first loss 4.67 to 4.68 (the tutorial's 4.68),
  # the last three 0.81 to 1.05 below it; at a learning rate of 0, 0.003
  # to 0.007 above it.
  assert len(losses) == 15
  assert 4.6 < losses[0] < 4.75
  assert np.mean(losses[-3:]) < losses[0] - 0.6, losses


def test_sigterm_saves_checkpoint_at_current_step(real_data_dir, tmp_path):
  train_dir = str(tmp_path / 'train')
  proc = start_script('cifar10_train.py', '--data_dir=' + real_data_dir,
                      '--train_dir=' + train_dir, '--batch_size=16',
                      '--log_frequency=1', '--max_steps=100000')
  for _ in range(25):
    proc.out.wait_for(STEP_LINE, timeout=300)
  proc.send_signal(signal.SIGTERM)
  proc.wait(timeout=120)
  assert proc.returncode == 0, proc.err.text()[-3000:]
  out = proc.out.text()
  steps = [int(m.group(1)) for m in STEP_LINE.finditer(out)]
  assert 'Stopped by signal %d' % signal.SIGTERM in out
  # The checkpoint holds every step that ran: the last logged one + 1.
  assert checkpoint_step(train_dir) == steps[-1] + 1 >= 25


def test_nan_loss_names_the_rate_that_scaling_made(real_data_dir, tmp_path):
  # Two towers of 16 by the linear rule: the step's rate is 1e5 * 32 / 128.
  result = run_script('cifar10_multi_gpu_train.py', '--num_gpus=2',
                      '--virtual_gpus', '--data_dir=' + real_data_dir,
                      '--train_dir=' + str(tmp_path / 'train'),
                      '--batch_size=16', '--max_steps=200',
                      '--initial_learning_rate=1e5',
                      '--learning_rate_scaling=linear')
  assert result.returncode == 1
  lines = error_lines(result.stderr)
  assert len(lines) == 1 and 'Traceback' not in result.stderr
  assert re.search(r'Lower --initial_learning_rate \(now 100000; the rate '
                   r'at step \d+ was 25000\)', lines[0]), lines[0]


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
  match = re.match(r'Error: Model diverged with loss = (nan|inf) at step '
                   r'(\d+)\. ', lines[0])
  assert match, lines[0]
  assert 'Lower --initial_learning_rate (now 100000)' in lines[0]
  kept = tf.train.latest_checkpoint(train_dir)
  assert kept and kept in lines[0]
  # The NaN check runs before the saver: the step that diverged, which
  # every step would have saved (--save_checkpoint_steps=1), is not saved.
  diverged = int(match.group(2))
  assert os.path.exists(os.path.join(train_dir, 'model.ckpt-%d.index'
                                     % diverged))
  assert not glob.glob(os.path.join(train_dir, 'model.ckpt-%d.*'
                                    % (diverged + 1)))
  reader = tf.train.load_checkpoint(kept)
  for name in reader.get_variable_to_shape_map():
    value = reader.get_tensor(name)
    if np.issubdtype(np.asarray(value).dtype, np.floating):
      assert np.all(np.isfinite(value)), name


def test_ctrl_c_saves_a_checkpoint_and_stops(fake_data_dir, tmp_path):
  train_dir = str(tmp_path / 'train')
  proc = start_script('cifar10_train.py', '--data_dir=' + fake_data_dir,
                      '--train_dir=' + train_dir, '--batch_size=8',
                      '--log_frequency=1', '--max_steps=100000')
  stdout, stderr = proc.out, proc.err
  for _ in range(5):
    stdout.wait_for(STEP_LINE, timeout=300)
  proc.send_signal(signal.SIGINT)
  proc.wait(timeout=120)
  assert proc.returncode == 0, stderr.text()[-3000:]
  step = checkpoint_step(train_dir)
  assert step >= 5
  assert stdout.text().splitlines()[-1] == (
      'Stopped by signal 2; checkpoint saved in %s/model.ckpt-%d.'
      % (train_dir, step))


def test_a_second_signal_interrupts_at_once():
  from machinery import step_hooks  # pylint: disable=g-import-not-at-top
  hook = step_hooks.StopOnSignalHook()
  hook.begin()
  try:
    os.kill(os.getpid(), signal.SIGINT)  # Noted: stop after this step.
    assert hook.received == signal.SIGINT
    with pytest.raises(KeyboardInterrupt):
      os.kill(os.getpid(), signal.SIGINT)
  finally:
    hook.end(None)
  assert signal.getsignal(signal.SIGINT) is not hook._handle


def test_an_interrupt_is_one_line_and_status_130(capsys, monkeypatch):
  from machinery import cli  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(sys, 'argv', ['cifar10_train.py'])

  def interrupted(argv):
    raise KeyboardInterrupt
  with pytest.raises(SystemExit) as exit_status:
    cli.run_main(interrupted)
  assert exit_status.value.code == 130
  assert capsys.readouterr().err == 'Interrupted.\n'


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
    result = evaluate(fake_data_dir, checkpoint_dir, tmp_path / 'eval',
                      run_once, timeout=120)
    assert result.returncode == 1
    assert error_lines(result.stderr) == [
        "Error: Checkpoint %s/model.ckpt-0 is not this model's: %s. Point "
        "--checkpoint_dir at a --train_dir of this project's trainers."
        % (checkpoint_dir, wrong)]


@pytest.mark.parametrize('script', ['cifar10_train.py',
                                    'cifar10_multi_gpu_train.py'])
def test_trainer_on_another_models_checkpoint_is_one_line(
    fake_data_dir, tmp_path, script):
  train_dir = tmp_path / 'other'
  _save_other_checkpoint(str(train_dir), {'dense/kernel': [10, 10]})
  def files():
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns)
            for p in train_dir.iterdir() if p.is_file()}
  before = files()
  result = run_script(script, '--data_dir=' + fake_data_dir,
                      '--train_dir=' + str(train_dir), '--max_steps=5',
                      '--batch_size=8', timeout=120)
  assert result.returncode == 1
  assert 'Traceback' not in result.stderr
  assert error_lines(result.stderr) == [
      "Error: Checkpoint %s/model.ckpt-0 is not this model's: it has no "
      "conv1/biases. Nothing was changed; give --train_dir a new directory, "
      "or one of this trainer's runs." % train_dir]
  # Its files as they were; only the trainer's lock file is new.
  after = files()
  after.pop('trainer.lock', None)
  assert after == before
  assert sorted(p.name for p in train_dir.iterdir() if p.is_dir()) == []


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
    result = evaluate(fake_data_dir, train_dir, tmp_path / 'eval', flag,
                      '--batch_size=8', '--num_examples=16')
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'precision @ 1 = ' in result.stdout
  resumed = run_script('cifar10_train.py', '--max_steps=15', *args)
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert 'Resuming from %s/model.ckpt-10.' % train_dir in resumed.stdout
  assert checkpoint_step(train_dir) == 15


def test_eval_raw_weights_restores_the_trained_variables(fake_data_dir,
                                                         tmp_path):
  import cifar10_eval  # pylint: disable=g-import-not-at-top
  train_dir = str(tmp_path / 'train')
  trained = run_script('cifar10_train.py', '--data_dir=' + fake_data_dir,
                       '--train_dir=' + train_dir, '--batch_size=8',
                       '--max_steps=30')
  assert trained.returncode == 0, trained.stderr[-2000:]
  checkpoint = tf.train.latest_checkpoint(train_dir)
  reader = tf.train.load_checkpoint(checkpoint)

  restored = {}
  for raw in (False, True):
    with tf.Graph().as_default():
      cifar10.inference(tf.zeros([1, 24, 24, 3]))
      variables = cifar10_eval.weights_to_restore(raw)
      with tf1.Session() as sess:
        tf1.train.Saver(variables).restore(sess, checkpoint)
        restored[raw] = {v.op.name: sess.run(v) for v in variables.values()}
  names = sorted(restored[True])
  assert len(names) == 10 and 'conv1/weights' in names
  for name in names:
    np.testing.assert_array_equal(restored[True][name],
                                  reader.get_tensor(name))
    np.testing.assert_array_equal(
        restored[False][name],
        reader.get_tensor(name + '/ExponentialMovingAverage'))
  # After 30 steps the averages lag the weights: nearly every value differs.
  for name in ('conv1/weights', 'local3/weights'):
    differ = restored[True][name] != restored[False][name]
    assert differ.mean() > 0.5, (name, differ.mean())

  for flag, suffix, tag in (('--noraw_weights', '', 'Precision @ 1'),
                            ('--raw_weights', ' (raw weights)',
                             'Precision @ 1 (raw weights)')):
    eval_dir = str(tmp_path / ('eval' + flag))
    result = evaluate(fake_data_dir, train_dir, eval_dir, flag,
                      '--batch_size=8', '--num_examples=16')
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [l for l in result.stdout.splitlines() if 'precision @ 1' in l]
    assert len(lines) == 1 and re.search(
        r': precision @ 1 = [01]\.\d{3}%s$' % re.escape(suffix), lines[0])
    assert [step for step, _ in _event_tags(eval_dir)[tag]] == [30]
