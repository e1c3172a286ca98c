"""Faults during training: kill -9 and resume; eval beside a running trainer."""

import os
import random
import re
import signal
import time

import tensorflow as tf

from conftest import STEP_LINE, checkpoint_step, run_script, start_script


def _all_checkpoints_readable(train_dir):
  state = tf.train.get_checkpoint_state(train_dir)
  for path in state.all_model_checkpoint_paths:
    reader = tf.train.load_checkpoint(path)
    assert int(reader.get_tensor('global_step')) == int(path.split('-')[-1])


def test_kill_9_then_resume_redoes_at_most_one_interval(real_data_dir,
                                                        tmp_path):
  train_dir = str(tmp_path / 'train')
  args = ['--data_dir=' + real_data_dir, '--train_dir=' + train_dir,
          '--batch_size=16', '--log_frequency=1', '--max_steps=70',
          '--save_checkpoint_steps=10']
  rng = random.Random(7)
  for _ in range(3):
    proc = start_script('cifar10_train.py', *args)
    stdout, stderr = proc.out, proc.err
    kill_after = rng.randint(3, 25)  # Step lines of this run.
    for _ in range(kill_after):
      last = int(stdout.wait_for(STEP_LINE, timeout=300).group(1))
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, stderr.text()[-3000:]
    saved = checkpoint_step(train_dir)
    # Step `last` was done, so last + 1 steps: at most one interval of 10
    # of them is lost.
    assert saved is not None and saved >= last + 1 - 10, (saved, last)
    _all_checkpoints_readable(train_dir)

  final = run_script('cifar10_train.py', *args)
  assert final.returncode == 0, final.stderr[-3000:]
  first = int(STEP_LINE.search(final.stdout).group(1))
  assert first == saved  # Resumed from the last checkpoint.
  assert checkpoint_step(train_dir) == 70
  _all_checkpoints_readable(train_dir)


def _evaluated_steps(eval_dir):
  """The global steps of the Precision @ 1 summaries in eval_dir."""
  steps = []
  for name in sorted(os.listdir(eval_dir)) if os.path.isdir(eval_dir) else []:
    if not name.startswith('events.out.tfevents'):
      continue  # The evaluator's lock file.
    events = tf.compat.v1.train.summary_iterator(os.path.join(eval_dir, name))
    try:
      for event in events:
        if any(v.tag == 'Precision @ 1' for v in event.summary.value):
          steps.append(event.step)
    except tf.errors.DataLossError:
      pass  # A record the evaluator is still writing: read on next time.
  return steps


def _wait_until_evaluated(eval_dir, step, timeout):
  deadline = time.time() + timeout
  while step not in _evaluated_steps(eval_dir):
    assert time.time() < deadline, (step, _evaluated_steps(eval_dir))
    time.sleep(0.5)


def test_periodic_eval_beside_training(real_data_dir, tmp_path):
  train_dir = str(tmp_path / 'train')
  eval_dir = str(tmp_path / 'eval')
  evaluator = start_script('cifar10_eval.py', '--data_dir=' + real_data_dir,
                           '--checkpoint_dir=' + train_dir,
                           '--eval_dir=' + eval_dir, '--eval_interval_secs=1',
                           '--num_examples=64', '--batch_size=64')
  stdout, stderr = evaluator.out, evaluator.err
  try:
    stdout.wait_for('No checkpoint file found in %s; waiting.' % train_dir,
                    timeout=120)
    # Two trainings one after the other: the evaluator, waiting beside,
    # evaluates the last checkpoint of each.
    for max_steps in (8, 16):
      trained = run_script('cifar10_train.py', '--data_dir=' + real_data_dir,
                           '--train_dir=' + train_dir, '--batch_size=16',
                           '--max_steps=%d' % max_steps,
                           '--save_checkpoint_steps=4')
      assert trained.returncode == 0, trained.stderr[-3000:]
      _wait_until_evaluated(eval_dir, max_steps, timeout=120)
    assert evaluator.poll() is None, stderr.text()[-3000:]
  finally:
    evaluator.send_signal(signal.SIGINT)
    evaluator.wait(timeout=60)
  assert 'Traceback' not in stderr.text(), stderr.text()[-3000:]
  steps = _evaluated_steps(eval_dir)
  # Each checkpoint at most once, in order; those two among them.
  assert steps == sorted(set(steps)) and {8, 16} <= set(steps), steps
  assert len(re.findall('precision @ 1 = ', stdout.text())) == len(steps)
