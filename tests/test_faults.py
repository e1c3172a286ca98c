"""Faults during training: kill -9 and resume; eval beside a running trainer."""

import os
import random
import signal
import subprocess
import sys
import time

import tensorflow as tf

from conftest import REPO, STEP_LINE, checkpoint_step, run_script


def _default_sigint():
  # As in a terminal: a test run started in the background ('cmd &' in a
  # script) ignores SIGINT, and Python keeps an ignored SIGINT ignored.
  signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(script, *args):
  return subprocess.Popen(
      [sys.executable, os.path.join(REPO, script)] + list(args),
      cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      preexec_fn=_default_sigint)


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
    proc = _start('cifar10_train.py', *args)
    kill_after = rng.randint(3, 25)  # Step lines of this run.
    seen = []
    for line in proc.stdout:
      match = STEP_LINE.match(line.strip())
      if match:
        seen.append(int(match.group(1)))
        if len(seen) == kill_after:
          proc.send_signal(signal.SIGKILL)
          break
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, 'ran to the end: %s' % seen
    saved = checkpoint_step(train_dir)
    # Everything up to the last completed 10-step interval is saved.
    assert saved is not None and saved >= (seen[-1] + 1) // 10 * 10 - 10
    _all_checkpoints_readable(train_dir)

  final = run_script('cifar10_train.py', *args)
  assert final.returncode == 0, final.stderr[-3000:]
  first = int(STEP_LINE.search(final.stdout).group(1))
  assert first == saved  # Resumed from the last checkpoint.
  assert checkpoint_step(train_dir) == 70
  _all_checkpoints_readable(train_dir)


def test_periodic_eval_beside_training(real_data_dir, tmp_path):
  train_dir = str(tmp_path / 'train')
  trainer = _start('cifar10_train.py', '--data_dir=' + real_data_dir,
                   '--train_dir=' + train_dir, '--batch_size=16',
                   '--max_steps=120', '--save_checkpoint_steps=4')
  evaluator = _start('cifar10_eval.py', '--data_dir=' + real_data_dir,
                     '--checkpoint_dir=' + train_dir,
                     '--eval_dir=' + str(tmp_path / 'eval'),
                     '--eval_interval_secs=1', '--num_examples=64',
                     '--batch_size=64')
  try:
    trainer_out, trainer_err = trainer.communicate(timeout=300)
    assert trainer.returncode == 0, trainer_err[-3000:]
    time.sleep(4)  # One more interval to see the final checkpoint.
    assert evaluator.poll() is None, evaluator.stderr.read()[-3000:]
  finally:
    evaluator.send_signal(signal.SIGINT)
    out, err = evaluator.communicate(timeout=60)
  assert 'Traceback' not in err, err[-3000:]
  precisions = [l for l in out.splitlines() if 'precision @ 1 = ' in l]
  assert len(precisions) >= 2, out
  del trainer_out
