"""The held-out split: --hold_out trains without the last 5,000 training
images, cifar10_eval.py --eval_data=held_out counts exactly those."""

import os

import numpy as np
import pytest
import tensorflow as tf

import cifar10_input
from conftest import evaluate, script_graph, train, write_records
from machinery import cluster
from test_train_eval import _save_constant_model

tf1 = tf.compat.v1

PER_FILE = 10000  # The real files' records: the split counts them.
KEPT = 50000 - cifar10_input.NUM_EXAMPLES_HELD_OUT


@pytest.fixture(scope='module')
def split_data_dir(tmp_path_factory):
  """Data in the real layout (blank images, fast to write) whose training
  records are labelled 0, but the held-out ones: 1, and 2 for their last
  1,000; the test records 3."""
  data_dir = str(tmp_path_factory.mktemp('split_data'))
  batches_dir = os.path.join(data_dir, cifar10_input.BATCHES_DIR)
  os.makedirs(batches_dir)
  images = np.zeros((PER_FILE, 32, 32, 3), np.uint8)
  for i, name in enumerate(cifar10_input.TRAIN_FILES):
    first = i * PER_FILE
    labels = [_label(first + j) for j in range(PER_FILE)]
    write_records(os.path.join(batches_dir, name), labels, images)
  write_records(os.path.join(batches_dir, cifar10_input.TEST_FILES[0]),
                [3] * PER_FILE, images)
  return data_dir


def _label(record):
  """The label split_data_dir gives training record number record."""
  if record < KEPT:
    return 0
  return 2 if record >= 50000 - 1000 else 1


def _labels_drawn(data_dir, hold_out, examples):
  """The labels of the first examples the training pipeline gives."""
  with tf.Graph().as_default():
    (_, labels), = cifar10_input.distorted_batches(data_dir, 1000, 1,
                                                   hold_out)
    with tf1.Session() as sess:
      return np.concatenate([sess.run(labels)
                             for _ in range(examples // 1000)])


def test_training_never_sees_the_held_out_images(split_data_dir):
  # The shuffle buffer holds 20,000 records: after 30,000 draws the last
  # 5,000 records have been in it for 5,000 draws.
  assert np.sum(_labels_drawn(split_data_dir, False, 30000) > 0) > 100
  assert np.sum(_labels_drawn(split_data_dir, True, 30000) > 0) == 0


@pytest.mark.parametrize('eval_data, args, expected', [
    # All 5,000 held-out images (not the default 10,000), the last 1,000
    # of them labelled 2: 0.2.
    ('held_out', [], '0.200'),
    ('held_out', ['--num_examples=2000'], '0.000'),
])
def test_eval_counts_the_held_out_images(split_data_dir, tmp_path, eval_data,
                                         args, expected):
  """A model that always says 2: its precision tells which images, and how
  many, the evaluator counted."""
  _save_constant_model(str(tmp_path / 'constant'), label=2)
  result = evaluate(split_data_dir, str(tmp_path / 'constant'),
                    tmp_path / 'eval', '--eval_data=' + eval_data,
                    '--batch_size=1000', *args)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip().endswith('precision @ 1 = ' + expected)


def test_more_than_the_held_out_images_is_one_error_line(split_data_dir,
                                                        tmp_path):
  _save_constant_model(str(tmp_path / 'constant'), label=2)
  result = evaluate(split_data_dir, str(tmp_path / 'constant'),
                    tmp_path / 'eval', '--eval_data=held_out',
                    '--num_examples=5001')
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
      'Error: --num_examples=5001 is more than the 5000 examples of '
      '--eval_data=held_out.')


@pytest.mark.parametrize('script, args', [
    ('cifar10_train.py', []),
    ('cifar10_multi_gpu_train.py', ['--num_gpus=2', '--virtual_gpus']),
    ('cifar10_model_parallel_train.py', ['--virtual_gpus']),
    ('cifar10_distributed_train.py', ['--job_name=worker', '--task_index=0']),
])
def test_every_trainer_holds_out_cuts_out_and_mixes_up_with_its_flags(
    fake_data_dir, tmp_path, script, args):
  """A trainer given --hold_out reads its records through a take() of the
  first 45,000 (its graph.pbtxt's TakeDataset), one given --cutout blanks
  a square in its preprocessing (ops in the name scope 'cutout' in the
  map function), and one given --mixup blends its batches (ops in the
  name scope 'mixup') and trains on the blended labels (a step runs:
  the tutorial's loss of one label an image would refuse them);
  without them, none of these."""
  if script == 'cifar10_distributed_train.py':
    args = args + ['--worker_hosts=127.0.0.1:%d'
                   % cluster.free_local_ports(1)[0]]
  takes, augmented = [], []
  for options in ([], ['--hold_out', '--cutout=8', '--mixup=0.2']):
    train_dir = str(tmp_path / ('held' if options else 'all'))
    result = train(fake_data_dir, train_dir, '--max_steps=1',
                   '--batch_size=8', *(args + options), script=script)
    assert result.returncode == 0, result.stderr[-3000:]
    takes.append(sorted(op for op in script_graph(train_dir).values()
                        if op == 'TakeDataset'))
    names = script_graph(train_dir, functions=True)
    augmented.append([any(name.startswith(scope + '/') for name in names)
                      for scope in ('cutout', 'mixup')])
  assert takes == [[], ['TakeDataset']]
  assert augmented == [[False, False], [True, True]]
