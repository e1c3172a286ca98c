"""Where there is no fcntl, as on Windows: every script starts, trains,
keeps one trainer per --train_dir, saves on Ctrl-C, and takes over the
lock a killed trainer left (machinery/lock.py)."""

import os
import signal

import pytest

from conftest import (STEP_LINE, checkpoint_step, error_lines,
                      in_use_line, run_script, start_script)

SCRIPTS = ['cifar10_train.py', 'cifar10_multi_gpu_train.py',
           'cifar10_model_parallel_train.py', 'cifar10_eval.py',
           'cifar10_predict.py', 'cifar10_distributed_train.py',
           'benchmark.py']


@pytest.fixture
def no_fcntl(tmp_path):
  """An environment in which `import fcntl` fails, as on Windows: a
  fcntl.py that raises ImportError stands first on PYTHONPATH."""
  shadow = tmp_path / 'no_fcntl'
  shadow.mkdir()
  (shadow / 'fcntl.py').write_text(
      'raise ImportError("No module named \'fcntl\' (hidden, as on '
      'Windows)")\n')
  return dict(os.environ, PYTHONPATH=str(shadow))


@pytest.mark.parametrize('script', SCRIPTS)
def test_every_script_starts_without_fcntl(no_fcntl, script):
  """--helpfull imports every module the script does and prints all their
  flags, its own among them, then exits 0."""
  result = run_script(script, '--helpfull', env=no_fcntl)
  assert result.returncode == 0, result.stderr[-2000:]
  assert 'Error' not in result.stderr and 'Traceback' not in result.stderr
  assert '--batch_size' in result.stdout


def test_towers_and_model_parallel_train_without_fcntl(
    no_fcntl, fake_data_dir, tmp_path):
  for script, flags in (('cifar10_multi_gpu_train.py', ['--num_gpus=2']),
                        ('cifar10_model_parallel_train.py', [])):
    train_dir = str(tmp_path / script)
    result = run_script(script, '--data_dir=' + fake_data_dir,
                        '--train_dir=' + train_dir, '--max_steps=3',
                        '--batch_size=8', *flags, env=no_fcntl)
    assert result.returncode == 0, result.stderr[-2000:]
    assert checkpoint_step(train_dir) == 3
    assert not os.path.exists(os.path.join(train_dir, 'trainer.lock'))


def test_without_fcntl_one_trainer_per_dir_ctrl_c_saves_kill_9_taken_over(
    no_fcntl, fake_data_dir, tmp_path):
  train_dir = str(tmp_path / 'train')
  lock_file = os.path.join(train_dir, 'trainer.lock')
  args = ['--data_dir=' + fake_data_dir, '--train_dir=' + train_dir,
          '--batch_size=8', '--log_frequency=1']
  first = start_script('cifar10_train.py', '--max_steps=1000000', *args,
                       env=no_fcntl)
  try:
    first.out.wait_for(STEP_LINE, timeout=300)  # Training: it holds it.
    # Stopped (as by Ctrl-Z), it holds it too, and leaves the cores to the
    # second trainer.
    first.send_signal(signal.SIGSTOP)
    second = run_script('cifar10_train.py', '--max_steps=1000000', *args,
                        env=no_fcntl)
    first.send_signal(signal.SIGCONT)
    assert second.returncode == 1
    assert error_lines(second.stderr) == [in_use_line(
        train_dir, first.pid, ['--max_steps=1000000'] + args,
        ' Where it no longer runs, delete %s.' % lock_file)]
    # Ctrl-C: a checkpoint at the step reached, and the lock released.
    first.send_signal(signal.SIGINT)
    stopped = first.out.wait_for(r'^Stopped by signal 2; checkpoint saved',
                                 timeout=120)
    assert stopped and first.wait(timeout=60) == 0
  finally:
    first.kill()
  assert not os.path.exists(lock_file)
  step = checkpoint_step(train_dir)
  assert step > 0

  # Killed (kill -9), a trainer leaves its lock file; the next takes it over.
  killed = start_script('cifar10_train.py', '--max_steps=1000000', *args,
                        env=no_fcntl)
  try:
    killed.out.wait_for(STEP_LINE, timeout=300)
  finally:
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=60)
  assert os.path.exists(lock_file)
  step = checkpoint_step(train_dir)
  after = run_script('cifar10_train.py', '--max_steps=%d' % (step + 3),
                     *args, env=no_fcntl)
  assert after.returncode == 0, after.stderr[-2000:]
  assert checkpoint_step(train_dir) == step + 3
  assert not os.path.exists(lock_file)


def test_without_fcntl_one_evaluator_per_eval_dir(no_fcntl, fake_data_dir,
                                                  tmp_path):
  train_dir = str(tmp_path / 'train')
  assert run_script('cifar10_train.py', '--data_dir=' + fake_data_dir,
                    '--train_dir=' + train_dir, '--max_steps=2',
                    '--batch_size=8', env=no_fcntl).returncode == 0
  eval_dir = str(tmp_path / 'eval')
  lock_file = os.path.join(eval_dir, 'evaluator.lock')
  args = ['--data_dir=' + fake_data_dir, '--checkpoint_dir=' + train_dir,
          '--eval_dir=' + eval_dir, '--batch_size=8', '--num_examples=16']
  first = start_script('cifar10_eval.py', '--eval_interval_secs=600', *args,
                       env=no_fcntl)
  try:
    first.out.wait_for(r'precision @ 1 = ', timeout=300)
    second = run_script('cifar10_eval.py', '--run_once', *args, env=no_fcntl)
  finally:
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=60)
  assert second.returncode == 1
  line, = error_lines(second.stderr)
  assert line.startswith('Error: --eval_dir=%s is in use by process %d on '
                         % (eval_dir, first.pid))
  assert line.endswith('or evaluate in another --eval_dir. Where it no '
                       'longer runs, delete %s.' % lock_file)
  # Killed, it left its lock file: the next evaluator takes it over, and
  # removes it when it ends.
  assert os.path.exists(lock_file)
  again = run_script('cifar10_eval.py', '--run_once', *args, env=no_fcntl)
  assert again.returncode == 0, again.stderr[-2000:]
  assert 'precision @ 1 = ' in again.stdout
  assert not os.path.exists(lock_file)
