"""Shared fixtures: the real CIFAR-10 archive, small fake data, script runs.

The real data is found through the environment variable CIFAR10_ARCHIVE,
which defaults to ../shared/data/cifar-10-binary.tar.gz beside the
repository. Tests that need it skip with a reason when it is absent,
except under CI (CI=true), where its absence is a failure.
"""

import os
import re
import subprocess
import sys
import tarfile

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import cifar10  # pylint: disable=g-import-not-at-top,wrong-import-position
import cifar10_input  # pylint: disable=g-import-not-at-top,wrong-import-position

# Tests read flags at their defaults (or as flagsaver sets them).
cifar10.FLAGS.mark_as_parsed()

ARCHIVE = os.environ.get(
    'CIFAR10_ARCHIVE',
    os.path.join(REPO, '..', 'shared', 'data', 'cifar-10-binary.tar.gz'))
ARCHIVE_MD5 = '4d63be8d021c62e4bc3219dd0b04a092'

STEP_LINE = re.compile(
    r'^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: step (\d+), loss = (\d+\.\d\d) '
    r'\((\d+\.\d) examples/sec; (\d+\.\d{3}) sec/batch\)$', re.M)


@pytest.fixture(scope='session')
def real_data_dir(tmp_path_factory):
  """A data_dir with the real CIFAR-10 extracted into it."""
  if not os.path.exists(ARCHIVE):
    message = ('real CIFAR-10 archive not found at %s (set CIFAR10_ARCHIVE)'
               % ARCHIVE)
    if os.environ.get('CI') == 'true':
      pytest.fail(message)
    pytest.skip(message)
  data_dir = tmp_path_factory.mktemp('cifar10_data')
  with tarfile.open(ARCHIVE, 'r:gz') as tar:
    tar.extractall(data_dir, filter='data')
  return str(data_dir)


def write_records(path, labels, images):
  """Writes CIFAR-10 binary records.

  Args:
    path: file to write.
    labels: sequence of ints.
    images: uint8 array [n, 32, 32, 3] (height, width, depth).
  """
  with open(path, 'wb') as f:
    for label, image in zip(labels, images):
      f.write(bytes([label]))
      f.write(np.transpose(image, [2, 0, 1]).astype(np.uint8).tobytes())


def make_fake_data(data_dir, records_per_file=20, seed=0):
  """Writes small random train and test files in the CIFAR-10 layout.

  Returns:
    dict file name -> (labels, images).
  """
  rng = np.random.RandomState(seed)
  batches_dir = os.path.join(data_dir, cifar10_input.BATCHES_DIR)
  os.makedirs(batches_dir, exist_ok=True)
  written = {}
  for name in cifar10_input.TRAIN_FILES + cifar10_input.TEST_FILES:
    labels = rng.randint(0, 10, size=records_per_file)
    images = rng.randint(0, 256, size=(records_per_file, 32, 32, 3))
    write_records(os.path.join(batches_dir, name), labels, images)
    written[name] = (labels, images)
  return written


@pytest.fixture
def fake_data_dir(tmp_path):
  """A data_dir with small random data in the CIFAR-10 layout."""
  make_fake_data(str(tmp_path))
  return str(tmp_path)


def run_script(script, *args, timeout=600, env=None):
  """Runs one of the repository's scripts; returns the CompletedProcess."""
  return subprocess.run(
      [sys.executable, os.path.join(REPO, script)] + list(args),
      cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)


def checkpoint_step(train_dir):
  """Global step of the latest checkpoint in train_dir, or None."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  path = tf.train.latest_checkpoint(train_dir)
  if path is None:
    return None
  return int(tf.train.load_checkpoint(path).get_tensor('global_step'))


def error_lines(stderr):
  """The lines of ours on stderr, without TensorFlow's start-up logging."""
  return [l for l in stderr.splitlines()
          if l.startswith('Error:')]
