"""Reads the CIFAR-10 binary file format into batches of images and labels.

The images are read with tf.data from the native binary files under
`<data_dir>/cifar-10-batches-bin`, decoded, distorted (training) or
centrally cropped (evaluation), standardized per image and batched.
Everything here runs on /cpu:0, so that the model's device is free for
the model. The files get there with cifar10.maybe_download_and_extract()
(machinery/download.py).

Usage in graph mode:

  images, labels = distorted_inputs(data_dir, batch_size)
  with tf.compat.v1.Session() as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    print(sess.run(labels))
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import os

from machinery import download
from machinery import errors
from machinery import summaries
import numpy as np
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
# The last training images, which a run that holds them out (hold_out)
# never trains on, so that recipes can be chosen on them, not on the test
# set.
NUM_EXAMPLES_HELD_OUT = 5000

# The binary layout: one label byte, then a 32x32x3 image, depth-major.
LABEL_BYTES = 1
HEIGHT = 32
WIDTH = 32
DEPTH = 3
IMAGE_BYTES = HEIGHT * WIDTH * DEPTH
RECORD_BYTES = LABEL_BYTES + IMAGE_BYTES

# Where the binary files lie in data_dir: the archive's directory.
BATCHES_DIR = download.BATCHES_DIR
TRAIN_FILES = ['data_batch_%d.bin' % i for i in range(1, 6)]
TEST_FILES = ['test_batch.bin']
# Each file holds 10,000 records; a larger one is not read.
MAX_FILE_BYTES = download.MAX_MEMBER_BYTES

# Fraction of an epoch held in the shuffle buffer (the tutorial's
# min_fraction_of_examples_in_queue), and threads for preprocessing.
MIN_FRACTION_OF_EXAMPLES_IN_QUEUE = 0.4
NUM_PREPROCESS_THREADS = 16

# Cutout (a recipe's --cutout) draws where its square goes from the image's
# seed folded with this number, so that the tutorial's five draws stay
# what they are.
CUTOUT_SEED_FOLD = 1
# Mixup (a recipe's --mixup) draws each image's share of itself from the
# image's seed folded with this number.
MIXUP_SEED_FOLD = 2


def buffered_bytes(batch_size, num_batches):
  """Returns the bytes the training pipeline holds: the raw records of its
  shuffle buffer and the 2 x num_batches float32 batches it makes ahead."""
  shuffle = int(NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN *
                MIN_FRACTION_OF_EXAMPLES_IN_QUEUE) * RECORD_BYTES
  return shuffle + 2 * num_batches * batch_size * IMAGE_SIZE ** 2 * DEPTH * 4


def check_data_file(filename, data_dir):
  """Checks that a file holds whole CIFAR-10 records with labels in 0..9.

  Args:
    filename: path of a binary batch file.
    data_dir: the data directory, named in the error messages.

  Raises:
    errors.DataError: the file is missing, empty, not a whole number of
      records, more than 10,000 records, or has a label byte outside 0..9.
  """
  if not tf.io.gfile.exists(filename):
    raise errors.DataError(
        'Failed to find file: %s. Get the data with `python cifar10_train.py '
        '--data_dir=%s` (it downloads CIFAR-10 from --data_url), or extract '
        'cifar-10-binary.tar.gz into %s.' % (filename, data_dir, data_dir))
  # The size first, so that a file of the wrong size is never read.
  size = tf.io.gfile.stat(filename).length
  if size == 0 or size % RECORD_BYTES or size > MAX_FILE_BYTES:
    raise errors.DataError(
        'Data file %s has %d bytes, not a positive multiple of the %d-byte '
        'CIFAR-10 record up to %s bytes (10,000 records): it is truncated or '
        'not CIFAR-10 data. Delete %s and run again to get the data anew.'
        % (filename, size, RECORD_BYTES, format(MAX_FILE_BYTES, ','),
           os.path.join(data_dir, BATCHES_DIR)))
  with tf.io.gfile.GFile(filename, 'rb') as f:
    data = np.frombuffer(f.read(), dtype=np.uint8)
  bad = np.flatnonzero(data[::RECORD_BYTES] >= NUM_CLASSES)
  if bad.size:
    raise errors.DataError(
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
    errors.DataError: a file is missing or malformed (see check_data_file).
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
  # To [height, width, depth]: the three planes stacked on a last axis. (A
  # transpose would do the same, but TensorFlow moves it before the cast,
  # onto the bytes, and oneDNN then logs an error line on CPUs without
  # AVX-512 uint8 support.)
  image = tf.cast(tf.stack(tf.unstack(depth_major), axis=-1), tf.float32)
  return label, image


def distort_image(image, seed, cutout=0):
  """Applies the tutorial's training distortions, in the tutorial's order.

  The random numbers come from the image's own seed (a stateless draw):
  whichever thread prepares the image, the same seed gives the same
  distortions.

  Args:
    image: a float32 [32, 32, 3] image.
    seed: the image's random seed, an int64 [2] tensor.
    cutout: the side in pixels of a square to blank out after the
      tutorial's distortions (cut_out); 0: none, as the tutorial's.

  Returns:
    A float32 [24, 24, 3] image, standardized.
  """
  # Five numbers in [0, 1) for this image.
  crop_y, crop_x, flip, brightness, contrast = tf.unstack(
      tf.random.stateless_uniform([5], seed))

  # Crop a random 24x24 window: one of 9 x 9 offsets.
  offsets = tf.cast(tf.stack([crop_y, crop_x]) * (HEIGHT - IMAGE_SIZE + 1),
                    tf.int32)
  image = tf.slice(image, tf.concat([offsets, [0]], axis=0),
                   [IMAGE_SIZE, IMAGE_SIZE, DEPTH])

  # Mirror it left to right, half the time.
  image = tf.cond(flip < 0.5, lambda: tf.image.flip_left_right(image),
                  lambda: image)

  # Shift its brightness by up to 63 either way, and scale its contrast by
  # a factor from 0.2 to 1.8.
  image = tf.image.adjust_brightness(image, (2 * brightness - 1) * 63)
  image = tf.image.adjust_contrast(image, 0.2 + 1.6 * contrast)
  image = tf.image.per_image_standardization(image)
  return cut_out(image, cutout, seed) if cutout else image


def cut_out(image, size, seed):
  """Blanks a size x size square of a standardized image (Cutout, DeVries
  and Taylor 2017): centred on a random pixel, so that near an edge only
  part of it falls on the image.

  Args:
    image: a float32 [24, 24, 3] image, standardized.
    size: the square's side in pixels.
    seed: the image's random seed, an int64 [2] tensor.

  Returns:
    The image, 0 (its mean) in every channel inside the square.
  """
  with tf.name_scope('cutout'):
    draw = tf.random.stateless_uniform(
        [2], tf.random.experimental.stateless_fold_in(seed, CUTOUT_SEED_FOLD))
    top_left = tf.cast(draw * IMAGE_SIZE, tf.int32) - size // 2
    pixels = tf.range(IMAGE_SIZE)
    rows = (pixels >= top_left[0]) & (pixels < top_left[0] + size)
    columns = (pixels >= top_left[1]) & (pixels < top_left[1] + size)
    square = rows[:, tf.newaxis] & columns[tf.newaxis, :]
    return tf.where(square[:, :, tf.newaxis], tf.zeros_like(image), image)


def mixup_share(seed, alpha):
  """Returns the share of itself an image keeps under mixup: a float32
  scalar in [0, 1] drawn from Beta(alpha, alpha) (two Gamma(alpha) draws,
  g1 / (g1 + g2)), from the image's seed."""
  with tf.name_scope('mixup'):
    gammas = tf.random.stateless_gamma(
        [2], tf.random.experimental.stateless_fold_in(seed, MIXUP_SEED_FOLD),
        alpha)
    return tf.math.divide_no_nan(gammas[0], gammas[0] + gammas[1])


def mix_batch(images, labels, shares):
  """Mixes each image of a batch with the one opposite it in the batch
  (mixup, Zhang et al. 2018): share of its own pixels and label, the rest
  of the other's. The records come shuffled, so the one opposite is a
  random partner.

  Args:
    images: float32 [batch, 24, 24, 3] distorted images.
    labels: int32 [batch] labels.
    shares: float32 [batch], each image's share of itself (mixup_share).

  Returns:
    images: float32 [batch, 24, 24, 3], each a blend of two.
    labels: float32 [batch, NUM_CLASSES], each row the blend's shares of
      the classes (summing to 1).
  """
  with tf.name_scope('mixup'):
    targets = tf.one_hot(labels, NUM_CLASSES)
    own = shares[:, tf.newaxis]
    labels = own * targets + (1 - own) * tf.reverse(targets, [0])
    own = tf.reshape(shares, [-1, 1, 1, 1])
    images = own * images + (1 - own) * tf.reverse(images, [0])
  return images, labels


def eval_image(image):
  """Crops the central 24x24 of an image and standardizes it.

  Args:
    image: a float32 [32, 32, 3] image.

  Returns:
    A float32 [24, 24, 3] image, standardized.
  """
  image = tf.image.resize_with_crop_or_pad(image, IMAGE_SIZE, IMAGE_SIZE)
  return tf.image.per_image_standardization(image)


def _dataset(filenames, preprocess, batch_size, shuffle_buffer,
             prefetch_batches, records=None, skip=0, mixup=0.0):
  """Builds the record -> preprocess -> batch pipeline.

  The shuffle and the records' seeds draw from the graph's seed: random
  without one, the same every run with one (tf.compat.v1.set_random_seed,
  which --seed sets).

  Args:
    filenames: list of binary files.
    preprocess: function from a [32, 32, 3] image and its random seed (an
      int64 [2] tensor) to a [24, 24, 3] image.
    batch_size: images per batch.
    shuffle_buffer: records held for shuffling; 0 for file order.
    prefetch_batches: batches made ahead of the consumer.
    records: None for every record of the files, or a function that takes
      the records' dataset and returns the part to read.
    skip: records drawn (shuffled, each with its seed) and passed over
      before the first batch: a resumed run's, so that with the graph's
      seed it goes on with the records it would have drawn unstopped.
    mixup: 0 for none; alpha > 0 to blend each batch's images in pairs
      (mix_batch), each image's share drawn from its seed.

  Returns:
    A repeating tf.data.Dataset of (images [batch, 24, 24, 3],
    labels [batch], or [batch, NUM_CLASSES] shares with mixup) with static
    shapes.
  """
  def parse(record, seed):
    label, image = decode_record(record)
    example = preprocess(image, seed), label
    return example + (mixup_share(seed, mixup),) if mixup else example

  dataset = tf.data.FixedLengthRecordDataset(filenames, RECORD_BYTES)
  if records is not None:
    dataset = records(dataset)
  records = dataset.repeat()
  if shuffle_buffer:
    records = records.shuffle(shuffle_buffer)
  # Each record with a random seed of its own, for its distortions.
  seeds = tf.data.Dataset.random().batch(2)
  dataset = tf.data.Dataset.zip((records, seeds))
  if skip:
    dataset = dataset.skip(skip)
  # parse branches with tf.cond, never with Python's `if` on a tensor (and
  # mix_batch has no branch), so tf.data need not rewrite them with
  # AutoGraph (which writes the rewrite to a temporary file, left behind
  # whenever the process is killed).
  plain = tf.autograph.experimental.do_not_convert
  dataset = dataset.map(plain(parse), num_parallel_calls=NUM_PREPROCESS_THREADS)
  dataset = dataset.batch(batch_size, drop_remainder=True)
  if mixup:  # Blends whole batches: after batch(), not in parse.
    dataset = dataset.map(plain(mix_batch))
  return dataset.prefetch(prefetch_batches)


def _kept(records):
  """Returns the training records a run that holds some out trains on."""
  return records.take(NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN - NUM_EXAMPLES_HELD_OUT)


def _held_out(records):
  """Returns the last NUM_EXAMPLES_HELD_OUT training records."""
  return records.skip(NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN - NUM_EXAMPLES_HELD_OUT)


def distorted_dataset(data_dir, batch_size, prefetch_batches, hold_out=False,
                      cutout=0, skip=0, mixup=0.0):
  """Builds the training pipeline as a tf.data.Dataset (graph or eager).

  Shuffles records in a buffer of 40% of an epoch and distorts them in
  parallel.

  Args:
    data_dir: path to the CIFAR-10 data directory.
    batch_size: number of images per batch.
    prefetch_batches: batches made ahead of the consumer.
    hold_out: leave the last NUM_EXAMPLES_HELD_OUT images out.
    cutout: the side of the square distort_image blanks; 0: none.
    skip: records to draw and pass over first (a resumed run's examples).
    mixup: the alpha of mix_batch's Beta(alpha, alpha) shares; 0: none.

  Returns:
    A repeating dataset of (float32 [batch_size, 24, 24, 3] images,
    int32 [batch_size] labels), with mixup float32 [batch_size, 10] label
    shares.
  """
  min_queue_examples = int(NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN *
                           MIN_FRACTION_OF_EXAMPLES_IN_QUEUE)
  print('Filling queue with %d CIFAR images before starting to train. '
        'This will take a few seconds.' % min_queue_examples)
  distort = lambda image, seed: distort_image(image, seed, cutout)
  return _dataset(data_files(data_dir, eval_data=False), distort,
                  batch_size, min_queue_examples, prefetch_batches,
                  _kept if hold_out else None, skip, mixup)


def distorted_batches(data_dir, batch_size, num_batches, hold_out=False,
                      cutout=0, skip=0, mixup=0.0):
  """Constructs distinct distorted batches from one shared input pipeline.

  The pipeline shuffles records in a buffer of 40% of an epoch, distorts
  them in parallel and prefetches 2 x num_batches batches; each of the
  num_batches outputs takes its own batch from it at every step (one per
  tower in the multi-GPU trainer).

  Args:
    data_dir: path to the CIFAR-10 data directory.
    batch_size: number of images per batch.
    num_batches: number of batches each step takes.
    hold_out: leave the last NUM_EXAMPLES_HELD_OUT training images out.
    cutout: the side of the square distort_image blanks; 0: none.
    skip: records to draw and pass over first (a resumed run's examples).
    mixup: the alpha of mix_batch's Beta(alpha, alpha) shares; 0: none.

  Returns:
    A list of num_batches (images, labels) pairs: float32
    [batch_size, 24, 24, 3] images and int32 [batch_size] labels (with
    mixup, float32 [batch_size, 10] shares of the classes).
  """
  with tf.device('/cpu:0'), tf.compat.v1.name_scope('input'):
    dataset = distorted_dataset(data_dir, batch_size, 2 * num_batches,
                                hold_out, cutout, skip, mixup)
    iterator = tf.compat.v1.data.make_one_shot_iterator(dataset)
    batches = []
    for _ in range(num_batches):
      # In tower order: batch i goes to tower i, every run (--seed).
      with tf.control_dependencies(batches[-1] if batches else []):
        batches.append(iterator.get_next())
    # Display the training images in the visualizer.
    summaries.image_summary('images', batches[-1][0])
  return batches


def distorted_inputs(data_dir, batch_size, hold_out=False, cutout=0, skip=0,
                     mixup=0.0):
  """Constructs distorted input for CIFAR training: one batch a step.

  Args:
    data_dir: path to the CIFAR-10 data directory.
    batch_size: number of images per batch.
    hold_out: leave the last NUM_EXAMPLES_HELD_OUT training images out.
    cutout: the side of the square distort_image blanks; 0: none.
    skip: records to draw and pass over first (a resumed run's examples).
    mixup: the alpha of mix_batch's Beta(alpha, alpha) shares; 0: none.

  Returns:
    images: float32 [batch_size, 24, 24, 3] tensor.
    labels: int32 [batch_size] tensor (with mixup, float32
      [batch_size, 10] shares of the classes).
  """
  return distorted_batches(data_dir, batch_size, 1, hold_out, cutout,
                           skip, mixup)[0]


def inputs(eval_data, data_dir, batch_size, held_out=False):
  """Constructs input for CIFAR evaluation, in file order, repeating.

  Args:
    eval_data: bool, whether to read the test set (True) or the training
      set (False).
    data_dir: path to the CIFAR-10 data directory.
    batch_size: number of images per batch.
    held_out: of the training set, only the last NUM_EXAMPLES_HELD_OUT
      images (those that hold_out leaves out of training).

  Returns:
    images: float32 [batch_size, 24, 24, 3] tensor.
    labels: int32 [batch_size] tensor.
  """
  with tf.device('/cpu:0'), tf.compat.v1.name_scope('input'):
    dataset = _dataset(data_files(data_dir, eval_data),
                       lambda image, _: eval_image(image),
                       batch_size, shuffle_buffer=0, prefetch_batches=2,
                       records=_held_out if held_out else None)
    images, labels = tf.compat.v1.data.make_one_shot_iterator(
        dataset).get_next()
    summaries.image_summary('images', images)
  return images, labels
