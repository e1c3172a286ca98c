"""What a user can hit around a run (machinery/session.py, machinery/cli.py):
unusable paths, reruns of finished training, two trainers on one
directory, a full disk."""

import os
import re
import signal

import pytest
import tensorflow as tf

from conftest import (STEP_LINE, checkpoint_step, error_lines, evaluate,
                      in_use_line, run_limited, run_script, start_script,
                      train)

# Every script's directory flags.
PATH_FLAGS = {
    'cifar10_train.py': ['data_dir', 'train_dir'],
    'cifar10_multi_gpu_train.py': ['data_dir', 'train_dir'],
    'cifar10_model_parallel_train.py': ['data_dir', 'train_dir'],
    'cifar10_distributed_train.py': ['data_dir', 'train_dir'],
    'cifar10_eval.py': ['data_dir', 'checkpoint_dir', 'eval_dir'],
    'cifar10_predict.py': ['data_dir', 'checkpoint_dir', 'export_dir'],
    'benchmark.py': ['data_dir'],
}

# Writes of more than this many bytes to one file fail: the graph and the
# first event file fit, a checkpoint's 8.5 MB of values do not.
SMALL_FILE_LIMIT = 2000000
# A checkpoint fits; an event file of some hundred summaries does not.
CHECKPOINT_FILE_LIMIT = 8700000

# What the error line says to do about a file-size limit, for a directory.
_FILE_SIZE_ADVICE = ('A file-size limit stopped it (ulimit -f, or a FAT32 '
                     'volume\'s 4 GB): lift it, or give --train_dir=%s on '
                     'another filesystem, and run again.')

def _cases():
  """(script, directory flag, how it is unusable) for each directory flag
  of each script, the two ways in turn: a file, or a path under a file.
  Both are one check (machinery/cli.py), which tests/test_cli.py runs on
  both for every directory flag; here each script runs it before any
  work, creating nothing."""
  pairs = [(script, name) for script in sorted(PATH_FLAGS)
           for name in PATH_FLAGS[script]]
  return [(script, name, ('file', 'under_file')[i % 2])
          for i, (script, name) in enumerate(pairs)]


@pytest.mark.parametrize('script,name,case', _cases())
def test_unusable_path_flag_is_one_line_and_creates_nothing(
    tmp_path, script, name, case):
  a_file = tmp_path / 'a_file'
  a_file.write_text('not a directory')
  bad = str(a_file) if case == 'file' else str(a_file / 'sub' / 'dir')
  # The script's other directories, which must not be created either.
  args = ['--%s=%s' % (other, tmp_path / other)
          for other in PATH_FLAGS[script] if other != name]
  result = run_script(script, '--%s=%s' % (name, bad), *args)
  assert result.returncode == 1, result.stderr[-2000:]
  problem = ('it is a file, not a directory' if case == 'file' else
             '%s is a file, so no directory can be made under it' % a_file)
  assert error_lines(result.stderr) == [
      'Error: --%s=%s: %s. Give a directory there.' % (name, bad, problem)]
  assert 'Traceback' not in result.stderr
  assert sorted(os.listdir(tmp_path)) == ['a_file']


# --helpfull for every script; --help for the one script whose --help
# tests/test_cli.py does not run (it runs the others' and asserts the same).
@pytest.mark.parametrize('script,flag', [
    (script, '--helpfull') for script in sorted(PATH_FLAGS)] + [
        ('benchmark.py', '--help')])
def test_help_exits_zero(script, flag):
  result = run_script(script, flag)
  assert result.returncode == 0
  assert 'Error' not in result.stderr and 'Traceback' not in result.stderr
  assert '--batch_size' in result.stdout


def _files(directory):
  """{name: (size, mtime)} of every file below directory."""
  found = {}
  for root, _, names in os.walk(directory):
    for name in names:
      stat = os.stat(os.path.join(root, name))
      found[os.path.join(root, name)] = (stat.st_size, stat.st_mtime_ns)
  return found


@pytest.mark.parametrize('script', ['cifar10_train.py',
                                    'cifar10_multi_gpu_train.py'])
def test_rerun_at_max_steps_does_nothing(fake_data_dir, tmp_path, script):
  train_dir = str(tmp_path / 'train')
  args = ['--data_dir=' + fake_data_dir, '--train_dir=' + train_dir,
          '--batch_size=8']
  first = run_script(script, '--max_steps=12', *args)
  assert first.returncode == 0, first.stderr[-2000:]
  assert checkpoint_step(train_dir) == 12
  before = _files(train_dir)
  for max_steps in (12, 5):
    again = run_script(script, '--max_steps=%d' % max_steps, *args)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.splitlines() == [
        'Training in %s has reached step 12, --max_steps is %d: nothing to '
        'do. To train on, run again with a higher --max_steps.'
        % (train_dir, max_steps)]
    assert _files(train_dir) == before
  more = run_script(script, '--max_steps=15', *args)
  assert more.returncode == 0 and checkpoint_step(train_dir) == 15


def test_one_trainer_per_train_dir_and_kill_9_leaves_no_lock(
    fake_data_dir, tmp_path):
  train_dir = str(tmp_path / 'train')
  args = ['--data_dir=' + fake_data_dir, '--train_dir=' + train_dir,
          '--batch_size=8']
  first = start_script('cifar10_train.py', '--max_steps=1000000',
                       '--log_frequency=1', *args)
  try:
    # Training, and so holding the lock; then stopped (as by Ctrl-Z),
    # which holds it too and leaves the cores to the processes below.
    first.out.wait_for(STEP_LINE, timeout=300)
    first.send_signal(signal.SIGSTOP)
    for script in ('cifar10_train.py', 'cifar10_multi_gpu_train.py'):
      second = run_script(script, '--max_steps=1000000', *args)
      assert second.returncode == 1
      assert error_lines(second.stderr) == [in_use_line(
          train_dir, first.pid,
          ['--max_steps=1000000', '--log_frequency=1'] + args)]
    # The evaluator reads beside it.
    evaluated = evaluate(fake_data_dir, train_dir, tmp_path / 'eval',
                         '--batch_size=8', '--num_examples=16')
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert 'precision @ 1 = ' in evaluated.stdout
  finally:
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=60)
  step = checkpoint_step(train_dir)
  after = run_script('cifar10_train.py', '--max_steps=%d' % (step + 3), *args)
  assert after.returncode == 0, after.stderr[-2000:]
  assert checkpoint_step(train_dir) == step + 3


# A directory with a space in its name (as Windows' user folders have).
@pytest.mark.parametrize('name', ['train', 'my train'])
def test_failed_checkpoint_write_is_one_line_and_resumable(fake_data_dir,
                                                           tmp_path, name):
  train_dir = str(tmp_path / name)
  args = ['--data_dir=' + fake_data_dir, '--train_dir=' + train_dir,
          '--batch_size=8']
  assert run_script('cifar10_train.py', '--max_steps=10', *args
                   ).returncode == 0
  good = os.path.join(train_dir, 'model.ckpt-10')
  full = run_limited(SMALL_FILE_LIMIT, 'cifar10_train.py', '--max_steps=30',
                     *args)
  assert full.returncode == 1
  # The checkpoint resumed from is not written again; the one at the end
  # fails.
  assert error_lines(full.stderr) == [
      'Error: Failed to write the checkpoint %s: File too large. Training '
      'stopped; the last good checkpoint, %s, is kept and the next run '
      'resumes from it. %s' % (os.path.join(train_dir, 'model.ckpt-30'),
                               good, _FILE_SIZE_ADVICE % train_dir)]
  assert 'Traceback' not in full.stderr
  # Nothing half-written is left.
  assert not [n for n in os.listdir(train_dir) if '_temp' in n]
  resumed = run_script('cifar10_train.py', '--max_steps=30', *args)
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert 'Resuming from %s.' % good in resumed.stdout
  assert checkpoint_step(train_dir) == 30


def test_a_checkpoint_too_large_mid_run_stops_with_one_line(fake_data_dir,
                                                            tmp_path):
  """The saver's write of a file over the size limit fails as an
  OutOfRangeError, which MonitoredSession would take for the end of the
  input and stop quietly, status 0."""
  train_dir = str(tmp_path / 'train')
  args = ['--data_dir=' + fake_data_dir, '--train_dir=' + train_dir,
          '--batch_size=8', '--save_checkpoint_steps=10']
  assert run_script('cifar10_train.py', '--max_steps=20', *args
                   ).returncode == 0
  good = os.path.join(train_dir, 'model.ckpt-20')
  full = run_limited(SMALL_FILE_LIMIT, 'cifar10_train.py', '--max_steps=60',
                     *args)
  assert full.returncode == 1, full.stdout[-2000:] + full.stderr[-2000:]
  assert error_lines(full.stderr) == [
      'Error: Failed to write the checkpoint %s: File too large. Training '
      'stopped; the last good checkpoint, %s, is kept and the next run '
      'resumes from it. %s' % (os.path.join(train_dir, 'model.ckpt-30'),
                               good, _FILE_SIZE_ADVICE % train_dir)]
  assert not [n for n in os.listdir(train_dir) if '_temp' in n]
  resumed = run_script('cifar10_train.py', '--max_steps=40', *args)
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert 'Resuming from %s.' % good in resumed.stdout
  assert checkpoint_step(train_dir) == 40


def test_failed_event_write_is_one_line_and_resumable(fake_data_dir,
                                                      tmp_path):
  train_dir = str(tmp_path / 'train')
  args = ['--data_dir=' + fake_data_dir, '--train_dir=' + train_dir,
          '--batch_size=1', '--save_summaries_steps=1']
  assert run_script('cifar10_train.py', '--max_steps=5', *args
                   ).returncode == 0
  full = run_limited(CHECKPOINT_FILE_LIMIT, 'cifar10_train.py',
                  '--max_steps=220', *args)
  assert full.returncode == 1
  lines = error_lines(full.stderr)
  assert len(lines) == 1, full.stderr[-3000:]
  assert 'Traceback' not in full.stderr and 'Exception in' not in full.stderr
  match = re.match(
      r'Error: Failed to write the event file (\S+/events\.out\.tfevents\.\S+)'
      r': File too large\. Training stopped; the last good checkpoint, (\S+), '
      r'is kept and the next run resumes from it\.', lines[0])
  assert match, lines[0]
  kept = match.group(2)
  assert kept.startswith(os.path.join(train_dir, 'model.ckpt-'))
  step = checkpoint_step(train_dir)
  assert kept.endswith('-%d' % step)
  # Nothing half-written: the event file ends with its last whole record.
  assert _whole_events(match.group(1))
  resumed = run_script('cifar10_train.py', '--max_steps=%d' % (step + 2),
                       *args)
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert 'Resuming from %s.' % kept in resumed.stdout


def _whole_events(path):
  """The events of an event file, which must hold whole records only."""
  return list(tf.compat.v1.train.summary_iterator(path))


def _trained(fake_data_dir, tmp_path):
  """A --train_dir with a 10-step checkpoint."""
  train_dir = str(tmp_path / 'train')
  assert train(fake_data_dir, train_dir, '--batch_size=8',
               '--max_steps=10').returncode == 0
  return train_dir


def test_failed_eval_event_write_is_one_line(fake_data_dir, tmp_path):
  train_dir = _trained(fake_data_dir, tmp_path)
  eval_dir = str(tmp_path / 'eval')
  args = ['--data_dir=' + fake_data_dir, '--checkpoint_dir=' + train_dir,
          '--eval_dir=' + eval_dir, '--run_once', '--batch_size=8',
          '--num_examples=16']
  # The graph fits; the evaluation's images and precision do not.
  full = run_limited(3000, 'cifar10_eval.py', *args)
  assert full.returncode == 1, full.stdout[-2000:] + full.stderr[-2000:]
  assert 'precision @ 1 = ' in full.stdout
  assert 'Traceback' not in full.stderr and 'Exception in' not in full.stderr
  lines = error_lines(full.stderr)
  match = re.match(
      r'Error: Failed to write the event file (%s/events\.out\.tfevents\.\S+)'
      r': File too large\. The precision of %s is printed above but not '
      r'recorded; the next evaluation records it\. A file-size limit '
      % (re.escape(eval_dir), re.escape(train_dir + '/model.ckpt-10')),
      '\n'.join(lines))
  assert match and len(lines) == 1, lines
  # Nothing half-written: the events written before the failure are whole.
  assert [e.step for e in _whole_events(match.group(1))] == [0]
  again = run_script('cifar10_eval.py', *args)
  assert again.returncode == 0, again.stderr[-2000:]
  recorded = [(e.step, v.simple_value)
              for name in os.listdir(eval_dir)
              if name.startswith('events.out.tfevents')
              for e in _whole_events(os.path.join(eval_dir, name))
              for v in e.summary.value if v.tag == 'Precision @ 1']
  assert [step for step, _ in recorded] == [10]


def test_failed_export_is_one_line_and_leaves_nothing(fake_data_dir,
                                                      tmp_path):
  train_dir = _trained(fake_data_dir, tmp_path)
  export_dir = str(tmp_path / 'exports' / 'model')
  full = run_limited(SMALL_FILE_LIMIT, 'cifar10_predict.py',
                     '--checkpoint_dir=' + train_dir,
                     '--export_dir=' + export_dir)
  assert full.returncode == 1, full.stdout[-2000:] + full.stderr[-2000:]
  assert error_lines(full.stderr) == [
      'Error: Failed to write the SavedModel to %s: File too large. Nothing '
      'was left there. %s' % (export_dir, (_FILE_SIZE_ADVICE % export_dir)
                              .replace('--train_dir', '--export_dir'))]
  assert os.listdir(str(tmp_path / 'exports')) == []
