"""The CIFAR-10 data: its download, and reading its binary file format.

The images are read with tf.data from the native binary files under
`<data_dir>/cifar-10-batches-bin`, decoded, distorted (training) or
centrally cropped (evaluation), standardized per image and batched.
Everything here runs on /cpu:0, so that the model's device is free for
the model. maybe_download_and_extract gets the archive there first: from
a URL (http(s):// or file://), md5-checked, extracted atomically.

Usage in graph mode:

  images, labels = distorted_inputs(data_dir, batch_size)
  with tf.compat.v1.Session() as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    print(sess.run(labels))
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import errno
import gzip
import hashlib
import http.client
import os
import shutil
import sys
import tarfile
import tempfile
import zlib

import cifar10_cli
import numpy as np
from six.moves import urllib
import tensorflow as tf

# Process images of this size. Note that this differs from the original
# CIFAR image size of 32 x 32. If one alters this number, then the entire
# model architecture will change and any model would need to be retrained.
IMAGE_SIZE = 24

# Global constants describing the CIFAR-10 data set.
NUM_CLASSES = 10
CLASS_NAMES = ('airplane', 'automobile', 'bird', 'cat', 'deer', 'dog', 'frog',
               'horse', 'ship', 'truck')
NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN = 50000
NUM_EXAMPLES_PER_EPOCH_FOR_EVAL = 10000

# The binary layout: one label byte, then a 32x32x3 image, depth-major.
LABEL_BYTES = 1
HEIGHT = 32
WIDTH = 32
DEPTH = 3
IMAGE_BYTES = HEIGHT * WIDTH * DEPTH
RECORD_BYTES = LABEL_BYTES + IMAGE_BYTES

BATCHES_DIR = 'cifar-10-batches-bin'
TRAIN_FILES = ['data_batch_%d.bin' % i for i in range(1, 6)]
TEST_FILES = ['test_batch.bin']

# Fraction of an epoch held in the shuffle buffer (the tutorial's
# min_fraction_of_examples_in_queue), and threads for preprocessing.
MIN_FRACTION_OF_EXAMPLES_IN_QUEUE = 0.4
NUM_PREPROCESS_THREADS = 16


# Where the data comes from: the official archive and its md5.
DATA_URL = 'https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz'
DATA_MD5 = 'c32a1d4ab5d03f1284b67883e8d87530'
# The archive (170 MB) and its extracted files (184 MB) together.
DATA_MEGABYTES = 360
# A write that failed for want of space: a full disk, a quota, a file
# size limit (ulimit -f).
FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class DataError(cifar10_cli.Error):
  """The data cannot be had: a failed download, a missing or bad file."""


def check_data_file(filename, data_dir):
  """Checks that a file holds whole CIFAR-10 records with labels in 0..9.

  Args:
    filename: path of a binary batch file.
    data_dir: the data directory, named in the error messages.

  Raises:
    DataError: the file is missing, empty, not a whole number of records,
      or has a label byte outside 0..9.
  """
  if not tf.io.gfile.exists(filename):
    raise DataError(
        'Failed to find file: %s. Get the data with `python cifar10_train.py '
        '--data_dir=%s` (it downloads CIFAR-10 from --data_url), or extract '
        'cifar-10-binary.tar.gz into %s.' % (filename, data_dir, data_dir))
  with tf.io.gfile.GFile(filename, 'rb') as f:
    data = np.frombuffer(f.read(), dtype=np.uint8)
  if data.size == 0 or data.size % RECORD_BYTES:
    raise DataError(
        'Data file %s has %d bytes, not a positive multiple of the %d-byte '
        'CIFAR-10 record: it is truncated or not CIFAR-10 data. Delete %s '
        'and run again to get the data anew.'
        % (filename, data.size, RECORD_BYTES,
           os.path.join(data_dir, BATCHES_DIR)))
  bad = np.flatnonzero(data[::RECORD_BYTES] >= NUM_CLASSES)
  if bad.size:
    raise DataError(
        'Data file %s: record %d has label byte %d, outside 0..%d: it is not '
        'CIFAR-10 data. Delete %s and run again to get the data anew.'
        % (filename, bad[0], data[bad[0] * RECORD_BYTES], NUM_CLASSES - 1,
           os.path.join(data_dir, BATCHES_DIR)))


def data_files(data_dir, eval_data):
  """Returns the checked list of binary files for a split.

  Args:
    data_dir: the directory that holds `cifar-10-batches-bin`.
    eval_data: bool, True for the test files, False for the training files.

  Returns:
    A list of file paths.

  Raises:
    DataError: a file is missing or malformed (see check_data_file).
  """
  names = TEST_FILES if eval_data else TRAIN_FILES
  filenames = [os.path.join(data_dir, BATCHES_DIR, name) for name in names]
  for filename in filenames:
    check_data_file(filename, data_dir)
  return filenames


def decode_record(record):
  """Decodes one CIFAR-10 binary record.

  Args:
    record: a scalar string tensor of RECORD_BYTES bytes.

  Returns:
    label: an int32 scalar in 0..9.
    image: a float32 [32, 32, 3] tensor of pixel values in 0..255.
  """
  record_bytes = tf.io.decode_raw(record, tf.uint8)
  label = tf.cast(record_bytes[0], tf.int32)
  # The image is stored depth-major: [depth, height, width].
  depth_major = tf.reshape(record_bytes[LABEL_BYTES:RECORD_BYTES],
                           [DEPTH, HEIGHT, WIDTH])
  image = tf.transpose(tf.cast(depth_major, tf.float32), [1, 2, 0])
  return label, image


def distort_image(image):
  """Applies the tutorial's training distortions, in the tutorial's order.

  Args:
    image: a float32 [32, 32, 3] image.

  Returns:
    A float32 [24, 24, 3] image, standardized.
  """
  image = tf.image.random_crop(image, [IMAGE_SIZE, IMAGE_SIZE, DEPTH])
  image = tf.image.random_flip_left_right(image)
  image = tf.image.random_brightness(image, max_delta=63)
  image = tf.image.random_contrast(image, lower=0.2, upper=1.8)
  return tf.image.per_image_standardization(image)


def eval_image(image):
  """Crops the central 24x24 of an image and standardizes it.

  Args:
    image: a float32 [32, 32, 3] image.

  Returns:
    A float32 [24, 24, 3] image, standardized.
  """
  image = tf.image.resize_with_crop_or_pad(image, IMAGE_SIZE, IMAGE_SIZE)
  return tf.image.per_image_standardization(image)


def image_from_file(contents):
  """Brings an image file of any size to the model's input, as eval_image.

  Decodes JPEG, PNG, BMP or GIF (its first frame) to RGB (grey is
  repeated, alpha dropped), scales it, keeping the aspect ratio, so that
  its shorter side is 32 pixels, crops the central 32x32 (a CIFAR-10
  image) and then, as eval_image, the central 24x24, and standardizes it.
  A 32x32 image is used as it is.

  Args:
    contents: a scalar string tensor, the file's bytes.

  Returns:
    A float32 [24, 24, 3] image.
  """
  image = tf.io.decode_image(contents, channels=DEPTH, dtype=tf.uint8,
                             expand_animations=False)
  image = tf.cast(image, tf.float32)

  # Halve large images first: each bilinear halving averages 2x2 blocks, so
  # fine detail does not alias (with ops TFLite has).
  def halve(image):
    return tf.image.resize(image, tf.shape(image)[:2] // 2)
  image, = tf.while_loop(
      lambda image: tf.reduce_min(tf.shape(image)[:2]) >= 2 * HEIGHT, halve,
      [image], shape_invariants=[tf.TensorShape([None, None, DEPTH])])
  size = tf.cast(tf.shape(image)[:2], tf.float32)
  scaled = tf.cast(tf.round(size * (HEIGHT / tf.reduce_min(size))), tf.int32)
  image = tf.cond(tf.reduce_all(tf.equal(scaled, tf.shape(image)[:2])),
                  lambda: image, lambda: tf.image.resize(image, scaled))
  image = tf.image.resize_with_crop_or_pad(image, HEIGHT, WIDTH)
  return eval_image(image)


def _dataset(filenames, preprocess, batch_size, shuffle_buffer,
             prefetch_batches):
  """Builds the record -> preprocess -> batch pipeline.

  Args:
    filenames: list of binary files.
    preprocess: function from a [32, 32, 3] image to a [24, 24, 3] one.
    batch_size: images per batch.
    shuffle_buffer: records held for shuffling; 0 for file order.
    prefetch_batches: batches made ahead of the consumer.

  Returns:
    A repeating tf.data.Dataset of (images [batch, 24, 24, 3],
    labels [batch]) with static shapes.
  """
  def parse(record):
    label, image = decode_record(record)
    return preprocess(image), label

  dataset = tf.data.FixedLengthRecordDataset(filenames, RECORD_BYTES).repeat()
  if shuffle_buffer:
    dataset = dataset.shuffle(shuffle_buffer)
  dataset = dataset.map(parse, num_parallel_calls=NUM_PREPROCESS_THREADS)
  dataset = dataset.batch(batch_size, drop_remainder=True)
  return dataset.prefetch(prefetch_batches)


def distorted_dataset(data_dir, batch_size, prefetch_batches):
  """The training pipeline as a tf.data.Dataset (graph or eager).

  Shuffles records in a buffer of 40% of an epoch and distorts them in
  parallel.

  Args:
    data_dir: path to the CIFAR-10 data directory.
    batch_size: number of images per batch.
    prefetch_batches: batches made ahead of the consumer.

  Returns:
    A repeating dataset of (float32 [batch_size, 24, 24, 3] images,
    int32 [batch_size] labels).
  """
  min_queue_examples = int(NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN *
                           MIN_FRACTION_OF_EXAMPLES_IN_QUEUE)
  print('Filling queue with %d CIFAR images before starting to train. '
        'This will take a few seconds.' % min_queue_examples)
  return _dataset(data_files(data_dir, eval_data=False), distort_image,
                  batch_size, min_queue_examples, prefetch_batches)


def distorted_batches(data_dir, batch_size, num_batches):
  """Constructs distinct distorted batches from one shared input pipeline.

  The pipeline shuffles records in a buffer of 40% of an epoch, distorts
  them in parallel and prefetches 2 x num_batches batches; each of the
  num_batches outputs takes its own batch from it at every step (one per
  tower in the multi-GPU trainer).

  Args:
    data_dir: path to the CIFAR-10 data directory.
    batch_size: number of images per batch.
    num_batches: number of batches each step takes.

  Returns:
    A list of num_batches (images, labels) pairs: float32
    [batch_size, 24, 24, 3] images and int32 [batch_size] labels.
  """
  with tf.device('/cpu:0'):
    dataset = distorted_dataset(data_dir, batch_size, 2 * num_batches)
    iterator = tf.compat.v1.data.make_one_shot_iterator(dataset)
    batches = [iterator.get_next() for _ in range(num_batches)]
  # Display the training images in the visualizer.
  tf.compat.v1.summary.image('images', batches[-1][0])
  return batches


def distorted_inputs(data_dir, batch_size):
  """Constructs distorted input for CIFAR training.

  Args:
    data_dir: path to the CIFAR-10 data directory.
    batch_size: number of images per batch.

  Returns:
    images: float32 [batch_size, 24, 24, 3] tensor.
    labels: int32 [batch_size] tensor.
  """
  return distorted_batches(data_dir, batch_size, 1)[0]


def inputs(eval_data, data_dir, batch_size):
  """Constructs input for CIFAR evaluation, in file order, repeating.

  Args:
    eval_data: bool, whether to read the test set (True) or the training
      set (False).
    data_dir: path to the CIFAR-10 data directory.
    batch_size: number of images per batch.

  Returns:
    images: float32 [batch_size, 24, 24, 3] tensor.
    labels: int32 [batch_size] tensor.
  """
  with tf.device('/cpu:0'):
    dataset = _dataset(data_files(data_dir, eval_data), eval_image,
                       batch_size, shuffle_buffer=0, prefetch_batches=2)
    images, labels = tf.compat.v1.data.make_one_shot_iterator(
        dataset).get_next()
  tf.compat.v1.summary.image('images', images)
  return images, labels


class _ProgressLine(object):
  """A line rewritten in place ('\\r'), ended before anything else prints.

  Use as a context manager: leaving it ends the line, also on an error, so
  an `Error:` line after it starts a line of its own.
  """

  def __init__(self):
    self._shown = False

  def show(self, text):
    sys.stdout.write('\r' + text)
    sys.stdout.flush()
    self._shown = True

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    if self._shown:
      sys.stdout.write('\n')
      sys.stdout.flush()


# What to do when the download itself fails.
_CHECK_URL = ('Check --data_url (a file:// URL works for a local copy of '
              'cifar-10-binary.tar.gz) or extract the archive into --data_dir.')


def _download(url, filepath):
  """Downloads url to filepath, via a temporary file, with a progress line.

  Args:
    url: http(s):// or file:// URL.
    filepath: where the file ends up.

  Raises:
    DataError: the download failed or was cut short, or the file could not
      be written; nothing is left behind.
  """
  filename = os.path.basename(filepath)
  # A file of its own, so that tasks downloading at once do not mix.
  fd, partial = tempfile.mkstemp(prefix=filename + '.', suffix='.part',
                                 dir=os.path.dirname(filepath))
  try:
    with os.fdopen(fd, 'wb') as out, _ProgressLine() as progress:
      _copy_download(url, out, progress, filepath)
  except BaseException:
    os.remove(partial)
    raise
  os.chmod(partial, 0o644)
  os.rename(partial, filepath)
  print('Successfully downloaded', filename, os.path.getsize(filepath),
        'bytes.')


def _copy_download(url, out, progress, filepath):
  """Copies what url holds to the open file out, showing progress.

  Raises:
    DataError: the download failed (the URL, the network: _CHECK_URL) or a
      write to out failed (a full disk: _full_disk_advice).
  """
  filename = os.path.basename(filepath)
  try:
    response = urllib.request.urlopen(url, timeout=60)
  except (OSError, ValueError, http.client.HTTPException) as e:
    # URLError (an OSError), an unknown URL type (ValueError), ...
    raise DataError('Failed to download %s: %s. %s'
                    % (url, getattr(e, 'reason', e), _CHECK_URL))
  with response:
    total = int(response.headers.get('Content-Length') or 0)
    received = 0
    while True:
      try:
        chunk = response.read(1 << 20)
      except (OSError, http.client.HTTPException) as e:  # The connection.
        raise DataError('Failed to download %s: %s. %s' % (url, e, _CHECK_URL))
      if not chunk:
        break
      try:
        out.write(chunk)
      except OSError as e:  # The disk.
        raise DataError('Failed to download %s: %s. %s' % (
            url, e, _full_disk_advice(e, filepath) or (
                'Check that --data_dir=%s can be written to.'
                % os.path.dirname(filepath))))
      received += len(chunk)
      if total:
        progress.show('>> Downloading %s %.1f%%' %
                      (filename, 100.0 * received / total))
      else:
        progress.show('>> Downloading %s %.1f MB' %
                      (filename, received / 1e6))
  if total and received != total:
    raise DataError('Failed to download %s: got %d of %d bytes. %s'
                    % (url, received, total, _CHECK_URL))


def _full_disk_advice(error, filepath):
  """What to do when a write failed for want of space, or None.

  Args:
    error: the exception a download or an extraction raised.
    filepath: the archive's path in --data_dir.

  Returns:
    A sentence for the error line, or None for other errors.
  """
  if getattr(error, 'errno', None) not in FULL_DISK_ERRNOS:
    return None
  return ('There is no room for the data in %s (it takes about %d MB): free '
          'space there, or choose another --data_dir.'
          % (os.path.dirname(filepath) or '.', DATA_MEGABYTES))


def _extract(filepath, directory):
  """Extracts a .tar.gz archive into directory, with a progress line.

  Raises:
    tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile: the archive
      is damaged.
    OSError: a write failed.
  """
  size = os.path.getsize(filepath) or 1
  with open(filepath, 'rb') as raw, _ProgressLine() as progress, \
      tarfile.open(fileobj=raw, mode='r:gz') as tar:
    for member in tar:
      tar.extract(member, directory, filter='data')
      progress.show('>> Extracting %s %.1f%%' % (
          os.path.basename(filepath), 100.0 * raw.tell() / size))


def _md5(filepath):
  """Returns the hex md5 of a file."""
  digest = hashlib.md5()
  with open(filepath, 'rb') as f:
    for chunk in iter(lambda: f.read(1 << 20), b''):
      digest.update(chunk)
  return digest.hexdigest()


def maybe_download_and_extract(data_dir, data_url=DATA_URL, data_md5=''):
  """Download and extract the tarball from Alex's website.

  Does nothing when <data_dir>/cifar-10-batches-bin exists. Otherwise gets
  the archive from data_url (unless it already lies in data_dir),
  checks its md5, extracts it into a temporary directory and renames that
  into place, so that no reader ever sees a half-extracted directory.

  Args:
    data_dir: the data directory.
    data_url: an http(s):// or file:// URL of the archive.
    data_md5: the md5 the archive must have; empty: DATA_MD5 for DATA_URL,
      no check for other URLs.

  Raises:
    DataError: the download failed, or the archive is corrupt or not
      CIFAR-10.
  """
  dest_directory = data_dir
  extracted_dir_path = os.path.join(dest_directory, BATCHES_DIR)
  if os.path.isdir(extracted_dir_path):
    return
  os.makedirs(dest_directory, exist_ok=True)
  url = data_url
  filename = url.split('/')[-1] or 'cifar-10-binary.tar.gz'
  filepath = os.path.join(dest_directory, filename)
  if not os.path.exists(filepath):
    _download(url, filepath)
  expected_md5 = data_md5 or (DATA_MD5 if url == DATA_URL else None)
  actual_md5 = _md5(filepath) if expected_md5 else None
  if actual_md5 != expected_md5:
    raise DataError(
        'Archive %s has md5 %s, not %s: it is corrupt or not the CIFAR-10 '
        'binary archive. Delete it and run again, or pass the right '
        '--data_md5.' % (filepath, actual_md5, expected_md5))
  staging = tempfile.mkdtemp(prefix='.extracting-', dir=dest_directory)
  try:
    _extract(filepath, staging)
    extracted = os.path.join(staging, BATCHES_DIR)
    if not os.path.isdir(extracted):
      raise DataError('Archive %s holds no %s directory: it is not the '
                       'CIFAR-10 binary archive.'
                       % (filepath, BATCHES_DIR))
    try:
      os.rename(extracted, extracted_dir_path)
    except OSError:
      if not os.path.isdir(extracted_dir_path):  # Not a concurrent extractor.
        raise
  except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as e:
    # The archive is damaged (BadGzipFile before the OSError it is).
    raise DataError('Failed to extract %s: %s. Delete it and run again.'
                    % (filepath, e))
  except OSError as e:  # Writing the files, or moving them into place.
    raise DataError('Failed to extract %s: %s. %s' % (
        filepath, e, _full_disk_advice(e, filepath) or (
            'Check that --data_dir=%s can be written to.' % dest_directory)))
  finally:
    shutil.rmtree(staging, ignore_errors=True)
