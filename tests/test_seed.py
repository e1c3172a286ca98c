"""--seed: the same seed repeats a run bit for bit, checkpoint for
checkpoint, stopped and resumed on the way or not; another seed, or none,
trains other weights."""

import glob
import os

import numpy as np
import pytest
import tensorflow as tf

from conftest import train


def _train(script, data_dir, train_dir, *flags, stops=(10,)):
  """Trains 10 steps of 8 with a checkpoint every 5, in one run for each of
  stops (its --max_steps: with (3, 10), stopped at step 3 and resumed);
  returns the variables of each checkpoint, {step: {name: value}}: steps 0
  (the initial weights), 5 and 10, and each stop's (a resumed run saves
  at the unstopped run's steps, not 5 after its stop)."""
  for stop in stops:
    result = train(data_dir, train_dir, '--max_steps=%d' % stop,
                   '--batch_size=8', '--save_checkpoint_steps=5', *flags,
                   script=script)
    assert result.returncode == 0, result.stderr[-3000:]
  checkpoints = {}
  for index in glob.glob(os.path.join(train_dir, 'model.ckpt-*.index')):
    reader = tf.train.load_checkpoint(index[:-len('.index')])
    checkpoints[int(reader.get_tensor('global_step'))] = {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()}
  assert sorted(checkpoints) == sorted({0, 5, 10} | set(stops))
  return checkpoints


def _differing(a, b):
  """The names of the variables whose values differ between a and b."""
  return [name for name in a
          if name != 'global_step' and not np.array_equal(a[name], b[name])]


def _assert_all_differ(a, b):
  """Asserts that two runs started from other random weights (the biases
  start at constants) and trained every variable to other values."""
  initial = sorted(name for name in a[0] if '/weights' in name)
  assert len(initial) == 10 and sorted(_differing(a[0], b[0])) == initial
  assert len(_differing(a[10], b[10])) == len(a[10]) - 1


@pytest.mark.parametrize('script,flags', [
    ('cifar10_train.py', []),
    ('cifar10_multi_gpu_train.py', ['--num_gpus=2', '--virtual_gpus']),
    ('cifar10_multi_gpu_train.py', ['--num_gpus=2',
                                    '--variable_update=replicated']),
    # The images blended in pairs by shares drawn from their own seeds.
    ('cifar10_train.py', ['--mixup=0.4']),
])
def test_same_seed_same_checkpoints_another_seed_other_weights(
    fake_data_dir, tmp_path, script, flags):
  # Run again, it stops at step 3 and resumes: its input passes over the
  # 24 x towers examples drawn, else steps 4-10 would train on steps 1-3's.
  first, again, other = [
      _train(script, fake_data_dir, str(tmp_path / name), '--seed=%d' % seed,
             *flags, stops=stops)
      for name, seed, stops in (('first', 3, (10,)), ('again', 3, (3, 10)),
                                ('other', 4, (10,)))]
  for step in (0, 5, 10):
    assert sorted(again[step]) == sorted(first[step])
    assert not _differing(first[step], again[step]), step
  _assert_all_differ(first, other)


def test_without_seed_runs_stay_random(fake_data_dir, tmp_path):
  first, again = [_train('cifar10_train.py', fake_data_dir,
                         str(tmp_path / name)) for name in ('first', 'again')]
  _assert_all_differ(first, again)
