"""Run directories moved, copied badly or damaged (machinery/checkpoints.py):
the trainer, evaluator and predict find what is really there, and nothing
the user had is lost or changed."""

import glob
import hashlib
import os
import shutil

import pytest

from conftest import (checkpoint_step, error_lines, evaluate, make_fake_data,
                      run_script, train, trained_run)
from machinery import checkpoints

# A trained run of 20 steps, with checkpoints at 0, 10 and 20.
STEPS = 20
SAVE_EVERY = 10
BATCH = ['--batch_size=8']


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp('data'))
  make_fake_data(path)
  return path


@pytest.fixture(scope='module')
def trained(data_dir, tmp_path_factory):
  """A --train_dir trained for STEPS steps, to be copied, not changed."""
  return trained_run(tmp_path_factory, data_dir, '--max_steps=%d' % STEPS,
                     '--save_checkpoint_steps=%d' % SAVE_EVERY, *BATCH)


def _train(data_dir, train_dir, max_steps):
  return train(data_dir, train_dir, '--max_steps=%d' % max_steps,
               '--save_checkpoint_steps=%d' % SAVE_EVERY, *BATCH)


def _evaluate(data_dir, checkpoint_dir, tmp_path):
  return evaluate(data_dir, checkpoint_dir, tmp_path / 'eval',
                  '--num_examples=16', *BATCH)


def _md5s(directory):
  """{file name: (md5, mtime)} of the checkpoint files and the index file.

  The time too: a checkpoint saved again with the same values may have
  the same bytes, but it was written.
  """
  found = {}
  for name in os.listdir(directory):
    if name.startswith('model.ckpt-') or name == 'checkpoint':
      path = os.path.join(directory, name)
      with open(path, 'rb') as f:
        found[name] = (hashlib.md5(f.read()).hexdigest(),
                       os.stat(path).st_mtime_ns)
  return found


def _assert_all_kept(before, train_dir, set_aside=()):
  """Every file of before is unchanged: in train_dir, or moved to
  set_aside/ if its name is in set_aside."""
  for name, md5 in before.items():
    if name == 'checkpoint' and name not in set_aside:
      continue  # The index file is the trainer's to rewrite.
    where = (os.path.join(train_dir, checkpoints.SET_ASIDE_DIR)
             if name in set_aside else train_dir)
    assert _md5s(where).get(name) == md5, (name, sorted(os.listdir(where)))


def _index_paths(train_dir):
  with open(os.path.join(train_dir, 'checkpoint')) as f:
    return [line.split('"')[1] for line in f if '"' in line]


def _resumed_from(stdout):
  lines = [l for l in stdout.splitlines() if l.startswith('Resuming from ')]
  assert len(lines) == 1, stdout
  return lines[0][len('Resuming from '):-1]


def _old_style_index(train_dir, written_at):
  """Writes the index file as older versions did: absolute paths, of the
  directory where the run was first written."""
  paths = ['%s/model.ckpt-%d' % (written_at, step)
           for step in range(0, STEPS + 1, SAVE_EVERY)]
  with open(os.path.join(train_dir, 'checkpoint'), 'w') as f:
    f.write('model_checkpoint_path: "%s"\n' % paths[-1])
    for path in paths:
      f.write('all_model_checkpoint_paths: "%s"\n' % path)


def test_new_runs_record_relative_paths(trained):
  assert _index_paths(trained) == ['model.ckpt-20', 'model.ckpt-0',
                                   'model.ckpt-10', 'model.ckpt-20']


@pytest.mark.parametrize('index', ['relative', 'old_absolute'])
def test_moved_directory_resumes_and_evaluates(trained, data_dir, tmp_path,
                                               index):
  first = str(tmp_path / 'first' / 'run')
  shutil.copytree(trained, first)
  if index == 'old_absolute':
    _old_style_index(first, first)
  moved = str(tmp_path / 'elsewhere' / 'run')
  shutil.move(first, moved)
  assert not os.path.exists(first)
  before = _md5s(moved)

  evaluated = _evaluate(data_dir, moved, tmp_path)
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  assert 'precision @ 1 = ' in evaluated.stdout
  predicted = run_script('cifar10_predict.py', '--checkpoint_dir=' + moved,
                         '--export_dir=' + str(tmp_path / 'saved'))
  assert predicted.returncode == 0, predicted.stderr[-3000:]
  assert ('Exported the model of %s/model.ckpt-20' % moved
          in predicted.stdout)

  resumed = _train(data_dir, moved, 30)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert _resumed_from(resumed.stdout) == moved + '/model.ckpt-20'
  assert checkpoint_step(moved) == 30
  assert _index_paths(moved)[0] == 'model.ckpt-30'
  _assert_all_kept(before, moved)


def _damage(train_dir, case):
  """Damages the newest checkpoint (step 20) or the index file.

  Returns:
    The names of the files the trainer is to set aside.
  """
  newest = os.path.join(train_dir, 'model.ckpt-20')
  if case == 'truncated_data':
    data = max((newest + '.' + n.split('.', 2)[2] for n in os.listdir(
        train_dir) if n.startswith('model.ckpt-20.data-')),
               key=os.path.getsize)
    os.truncate(data, os.path.getsize(data) // 2)
  elif case == 'missing_index':
    os.remove(newest + '.index')
  elif case == 'garbled_index_file':
    with open(os.path.join(train_dir, 'checkpoint'), 'wb') as f:
      f.write(b'\x00\x17garbage{{ "')
    return ['checkpoint']
  return [n for n in os.listdir(train_dir) if n.startswith('model.ckpt-20.')]


@pytest.mark.parametrize('case', ['truncated_data', 'missing_index'])
def test_damaged_newest_checkpoint_is_passed_over(trained, data_dir, tmp_path,
                                                  case):
  train_dir = str(tmp_path / 'run')
  shutil.copytree(trained, train_dir)
  set_aside = _damage(train_dir, case)
  before = _md5s(train_dir)
  newest = train_dir + '/model.ckpt-20'
  good = train_dir + '/model.ckpt-10'
  reason = ('its data is cut short' if case == 'truncated_data'
            else 'its index file model.ckpt-20.index is missing')

  evaluated = _evaluate(data_dir, train_dir, tmp_path)
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  passed = [l for l in evaluated.stdout.splitlines() if 'passed over' in l]
  assert len(passed) == 1, evaluated.stdout
  assert ('Note: checkpoint %s is passed over: %s' % (newest, reason)
          in passed[0]) and passed[0].endswith('Evaluating %s.' % good)
  assert _md5s(train_dir) == before  # The evaluator only reads.

  resumed = _train(data_dir, train_dir, 30)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  notes = [l for l in resumed.stdout.splitlines() if l.startswith('Note:')]
  assert len(notes) == 1, resumed.stdout
  assert notes[0].startswith('Note: checkpoint %s is passed over: %s'
                             % (newest, reason))
  assert notes[0].endswith('Its files are moved to %s/set_aside/. Training '
                           'resumes from %s.' % (train_dir, good))
  assert _resumed_from(resumed.stdout) == good
  assert checkpoint_step(train_dir) == 30
  _assert_all_kept(before, train_dir, set_aside)


def test_garbled_index_file_never_starts_over(trained, data_dir, tmp_path):
  train_dir = str(tmp_path / 'run')
  shutil.copytree(trained, train_dir)
  set_aside = _damage(train_dir, 'garbled_index_file')
  before = _md5s(train_dir)

  evaluated = _evaluate(data_dir, train_dir, tmp_path)
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  assert ('the index file %s/checkpoint is unreadable' % train_dir
          in evaluated.stdout)

  resumed = _train(data_dir, train_dir, 30)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert ('Note: the index file %s/checkpoint is unreadable (not a '
          'checkpoint state); moved it to %s/set_aside/ and went by the '
          'checkpoint files.' % (train_dir, train_dir)
          in resumed.stdout.splitlines())
  assert _resumed_from(resumed.stdout) == train_dir + '/model.ckpt-20'
  assert checkpoint_step(train_dir) == 30
  _assert_all_kept(before, train_dir, set_aside)


def test_nothing_readable_is_one_error_line_and_changes_nothing(
    trained, data_dir, tmp_path):
  train_dir = str(tmp_path / 'run')
  shutil.copytree(trained, train_dir)
  for name in os.listdir(train_dir):
    if name.endswith('.index'):
      os.remove(os.path.join(train_dir, name))
  before = _md5s(train_dir)
  runs = {
      'train': _train(data_dir, train_dir, 30),
      'eval': _evaluate(data_dir, train_dir, tmp_path),
      'predict': run_script('cifar10_predict.py',
                            '--checkpoint_dir=' + train_dir,
                            '--export_dir=' + str(tmp_path / 'saved')),
  }
  for name, result in runs.items():
    assert result.returncode == 1, (name, result.stderr[-3000:])
    assert 'Traceback' not in result.stderr
    lines = error_lines(result.stderr)
    assert len(lines) == 1, (name, result.stderr[-3000:])
    assert lines[0].startswith('Error: No readable checkpoint in %s: '
                               % train_dir)
    for step in (0, 10, 20):
      assert ('model.ckpt-%d: its index file model.ckpt-%d.index is missing'
              % (step, step)) in lines[0]
  assert _md5s(train_dir) == before
  assert not os.path.exists(os.path.join(train_dir, 'set_aside'))


def test_each_unreadable_checkpoint_says_why(trained, tmp_path):
  """The reason names what was found: a cut, a checksum, a bad index."""
  def reason(damage):
    train_dir = str(tmp_path / damage.__name__)
    shutil.copytree(trained, train_dir)
    newest = os.path.join(train_dir, 'model.ckpt-20')
    damage(newest, max(glob.glob(newest + '.data-*'), key=os.path.getsize))
    return checkpoints.unreadable_reason(newest)

  def cut(newest, data):
    del newest
    os.truncate(data, os.path.getsize(data) // 2)

  def flipped_byte(newest, data):
    del newest
    with open(data, 'r+b') as f:
      f.seek(os.path.getsize(data) // 2)
      byte = f.read(1)
      f.seek(-1, os.SEEK_CUR)
      f.write(bytes([byte[0] ^ 0xff]))

  def garbage_index(newest, data):
    del data
    with open(newest + '.index', 'wb') as f:
      f.write(b'garbage' * 10)

  assert reason(cut).startswith(
      'its data is cut short (Read less bytes than requested')
  damaged = reason(flipped_byte)
  assert damaged.startswith('its data cannot be read ('), damaged
  assert 'Checksum does not match' in damaged, damaged
  assert reason(garbage_index) == (
      'its index file model.ckpt-20.index cannot be read (not an sstable '
      '(bad magic number))')


def _all_files(directory):
  """{name: (md5, mtime)} of every file in directory."""
  found = {}
  for name in os.listdir(directory):
    path = os.path.join(directory, name)
    with open(path, 'rb') as f:
      found[name] = (hashlib.md5(f.read()).hexdigest(),
                     os.stat(path).st_mtime_ns)
  return found


@pytest.mark.parametrize('copied', [True, False])
def test_index_naming_checkpoints_elsewhere_never_touches_them(
    trained, data_dir, tmp_path, copied):
  """A learner copies an old run's index file (and its newest checkpoint,
  or not) into a new --train_dir: the old run's checkpoints, named by the
  index file absolutely or by ../, stay as they are through 7 saves of a
  saver that keeps 5."""
  old = str(tmp_path / 'old')
  shutil.copytree(trained, old)
  old_files = _all_files(old)
  train_dir = str(tmp_path / 'new')
  os.makedirs(train_dir)
  if copied:
    for name in os.listdir(old):
      if name.startswith('model.ckpt-20.'):
        shutil.copy(os.path.join(old, name), train_dir)
  outside = [old + '/model.ckpt-0', '../old/model.ckpt-10']
  named = outside + (['model.ckpt-20'] if copied else [])
  with open(os.path.join(train_dir, 'checkpoint'), 'w') as f:
    f.write('model_checkpoint_path: "%s"\n' % named[-1])
    for path in named:
      f.write('all_model_checkpoint_paths: "%s"\n' % path)
  note = ('Note: the index file of %s names checkpoints outside it, left out '
          '(nothing there is read or deleted): %s' % (
              train_dir, ', '.join([old + '/model.ckpt-0',
                                    old + '/model.ckpt-10'])))

  if copied:
    evaluated = _evaluate(data_dir, train_dir, tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert [l for l in evaluated.stdout.splitlines()
            if l.endswith(note + '.')], evaluated.stdout

  start = 20 if copied else 0
  resumed = _train(data_dir, train_dir, start + 7 * SAVE_EVERY)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  notes = [l for l in resumed.stdout.splitlines() if l.startswith('Note:')]
  if copied:
    assert notes == [note + '.']
    assert _resumed_from(resumed.stdout) == train_dir + '/model.ckpt-20'
  else:
    # Nothing of this directory's to go on from: the index file is moved
    # aside, so that the session does not restore what it names.
    assert notes == [note + '. Moved it to %s/set_aside/.' % train_dir]
    assert 'Resuming from' not in resumed.stdout
    assert os.listdir(os.path.join(train_dir, 'set_aside')) == ['checkpoint']
  assert checkpoint_step(train_dir) == start + 7 * SAVE_EVERY
  assert all(not p.startswith(('/', '..')) for p in _index_paths(train_dir))
  assert _all_files(old) == old_files
