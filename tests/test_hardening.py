"""What a user can hit around a run (machinery/session.py, machinery/cli.py):
unusable paths, reruns of finished training, two trainers on one
directory, a full disk."""

import importlib
import os
import re
import shutil
import signal

import pytest
import tensorflow as tf

from conftest import (STEP_LINE, checkpoint_step, error_lines, evaluate,
                      in_use_line, make_fake_data, run_limited, run_script,
                      start_script, trained_run)
from machinery import cli

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

# A run of this many steps of 8 (its checkpoint at the end), shared.
TRAINED_STEPS = 10


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """A --train_dir of TRAINED_STEPS steps on fake data (the same data as
  fake_data_dir's), to be read or copied, never changed."""
  data_dir = str(tmp_path_factory.mktemp('data'))
  make_fake_data(data_dir)
  return trained_run(tmp_path_factory, data_dir, '--batch_size=8',
                     '--max_steps=%d' % TRAINED_STEPS)


# What the error line says to do about a file-size limit, for a directory.
_FILE_SIZE_ADVICE = ('A file-size limit stopped it (ulimit -f, or a FAT32 '
                     'volume\'s 4 GB): lift it, or give --train_dir=%s on '
                     'another filesystem, and run again.')

# The runs of the check below: one directory flag per script, the
# evaluator's two of its own, so that each flag name runs in a script,
# the two ways of being unusable (a file, or a path under a file) in turn.
# One check (machinery/cli.py) covers every directory flag of every
# script: tests/test_cli.py runs it both ways on each flag, and
# test_every_directory_flag_is_checked that each script's are among those
# it checks.
CASES = [('benchmark.py', 'data_dir', 'file'),
         ('cifar10_distributed_train.py', 'train_dir', 'under_file'),
         ('cifar10_eval.py', 'checkpoint_dir', 'file'),
         ('cifar10_eval.py', 'eval_dir', 'under_file'),
         ('cifar10_model_parallel_train.py', 'data_dir', 'file'),
         ('cifar10_multi_gpu_train.py', 'train_dir', 'under_file'),
         ('cifar10_predict.py', 'export_dir', 'file'),
         ('cifar10_train.py', 'data_dir', 'under_file')]


def test_every_directory_flag_is_checked():
  """Each script's directory flags are defined once it is imported, and
  each is one that cli.check_path_flags checks."""
  for script, names in PATH_FLAGS.items():
    importlib.import_module(script[:-len('.py')])
    for name in names:
      assert name in cli.FLAGS and name in cli.PATH_FLAGS, (script, name)


@pytest.mark.parametrize('script,name,case', CASES)
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


# benchmark.py's --help: tests/test_cli.py runs the other scripts' --help,
# tests/test_portability.py every script's --helpfull.
def test_benchmark_help_exits_zero():
  result = run_script('benchmark.py', '--help')
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


# A rerun at the --max_steps reached, and at a lower one, one per trainer.
@pytest.mark.parametrize('script,max_steps', [('cifar10_train.py', 10),
                                              ('cifar10_multi_gpu_train.py',
                                               5)])
def test_rerun_at_max_steps_does_nothing(trained, fake_data_dir, tmp_path,
                                         script, max_steps):
  train_dir = str(tmp_path / 'train')
  args = ['--data_dir=' + fake_data_dir, '--train_dir=' + train_dir,
          '--batch_size=8']
  if script == 'cifar10_train.py':
    shutil.copytree(trained, train_dir)
  else:
    first = run_script(script, '--max_steps=10', *args)
    assert first.returncode == 0, first.stderr[-2000:]
  assert checkpoint_step(train_dir) == 10
  before = _files(train_dir)
  again = run_script(script, '--max_steps=%d' % max_steps, *args)
  assert again.returncode == 0, again.stderr[-2000:]
  assert again.stdout.splitlines() == [
      'Training in %s has reached step 10, --max_steps is %d: nothing to '
      'do. To train on, run again with a higher --max_steps.'
      % (train_dir, max_steps)]
  assert _files(train_dir) == before
  more = run_script(script, '--max_steps=13', *args)
  assert more.returncode == 0 and checkpoint_step(train_dir) == 13


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


def test_failed_checkpoint_write_is_one_line_and_resumable(trained,
                                                           fake_data_dir,
                                                           tmp_path):
  # A directory with a space in its name (as Windows' user folders have).
  train_dir = str(tmp_path / 'my train')
  shutil.copytree(trained, train_dir)
  args = ['--data_dir=' + fake_data_dir, '--train_dir=' + train_dir,
          '--batch_size=8']
  good = os.path.join(train_dir, 'model.ckpt-%d' % TRAINED_STEPS)
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


def test_failed_eval_event_write_is_one_line(trained, fake_data_dir,
                                             tmp_path):
  train_dir = trained
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
      % (re.escape(eval_dir),
         re.escape('%s/model.ckpt-%d' % (train_dir, TRAINED_STEPS))),
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
  assert [step for step, _ in recorded] == [TRAINED_STEPS]


def test_failed_export_is_one_line_and_leaves_nothing(trained, tmp_path):
  train_dir = trained
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
