"""The input pipeline, on records the tests write themselves."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import cifar10_input
from conftest import REPO, make_fake_data, write_records
from machinery import errors

tf1 = tf.compat.v1


def _standardize(image):
  image = image.astype(np.float64)
  return (image - image.mean()) / max(image.std(), 1.0 / np.sqrt(image.size))


def test_decode_record_label_and_depth_major_layout():
  image = np.arange(32 * 32 * 3).reshape(32, 32, 3) % 251
  record = bytes([7]) + np.transpose(image, [2, 0, 1]).astype(
      np.uint8).tobytes()
  assert len(record) == cifar10_input.RECORD_BYTES == 3073
  with tf.Graph().as_default():
    label, decoded = cifar10_input.decode_record(tf.constant(record))
    with tf1.Session() as sess:
      label, decoded = sess.run([label, decoded])
  assert label == 7
  assert decoded.dtype == np.float32 and decoded.shape == (32, 32, 3)
  np.testing.assert_array_equal(decoded, image)
  # Depth-major: the first 1024 pixel bytes are the red plane.
  assert decoded[0, 1, 0] == record[2] and decoded[0, 0, 1] == record[1025]


def test_eval_image_is_central_crop_standardized():
  image = np.random.RandomState(0).randint(0, 256, (32, 32, 3))
  with tf.Graph().as_default():
    out = cifar10_input.eval_image(tf.constant(image, tf.float32))
    with tf1.Session() as sess:
      out = sess.run(out)
  np.testing.assert_allclose(out, _standardize(image[4:28, 4:28]),
                             rtol=1e-4, atol=1e-4)


def _windows(image):
  """The 81 24x24 crops of a 32x32 image and their mirror images, with
  (y, x, flipped) of each."""
  for y in range(9):
    for x in range(9):
      window = image[y:y + 24, x:x + 24]
      yield (y, x, False), window
      yield (y, x, True), window[:, ::-1]


def _same_order(out, window):
  """Whether out is an increasing function of window, channel by channel.

  Brightness shifts every channel alike, contrast scales each about its
  mean, standardization is affine: all keep the order of the pixels.
  """
  out = out.reshape(-1, 3)
  window = window.reshape(-1, 3)
  return all(np.array_equal(np.argsort(out[:, c], kind='stable'),
                            np.argsort(window[:, c], kind='stable'))
             for c in range(3))


def _source(out, images):
  """(record, (y, x, flipped)) of the image and window out was made of."""
  for index, image in enumerate(images):
    for where, window in _windows(image):
      if _same_order(out, window):
        return index, where
  raise AssertionError('no crop of any record gives this output')


def test_distort_image_is_random_crop_flip_and_standardized():
  image = np.random.RandomState(1).randint(0, 256, (32, 32, 3))
  with tf.Graph().as_default():
    seed = tf1.placeholder(tf.int64, [2])
    distorted = cifar10_input.distort_image(tf.constant(image, tf.float32),
                                            seed)
    with tf1.Session() as sess:
      outs = [sess.run(distorted, {seed: [i, 7]}) for i in range(30)]
      # A function of the seed: the same seed, the same distortions.
      np.testing.assert_array_equal(sess.run(distorted, {seed: [4, 7]}),
                                    outs[4])
  for out in outs:
    assert out.shape == (24, 24, 3)
    assert abs(out.mean()) < 1e-4 and out.std() == pytest.approx(1, abs=1e-3)
  # Each output is one of the 81 crops, maybe mirrored: which one varies
  # from run to run, over offsets in both directions and both mirrorings.
  where = [_source(out, [image])[1] for out in outs]
  assert len(set(where)) >= 15, where
  assert {y for y, _, _ in where} != {4} and {x for _, x, _ in where} != {4}
  assert {flipped for _, _, flipped in where} == {False, True}


@pytest.mark.parametrize('side', [8, 12])
def test_cutout_blanks_one_square_of_the_same_distorted_image(side):
  """--cutout: each distorted image, as without it (the tutorial's draws
  kept), but 0 in every channel on one square of that side centred on a
  pixel, clipped where it passes an edge; the square moves with the
  seed."""
  image = np.random.RandomState(2).randint(0, 256, (32, 32, 3))
  with tf.Graph().as_default():
    seed = tf1.placeholder(tf.int64, [2])
    image = tf.constant(image, tf.float32)
    pair = (cifar10_input.distort_image(image, seed),
            cifar10_input.distort_image(image, seed, cutout=side))
    with tf1.Session() as sess:
      outs = [sess.run(pair, {seed: [i, 7]}) for i in range(60)]
  corners, areas = set(), []
  for whole, cut in outs:
    changed = np.any(whole != cut, axis=-1)
    blanked = np.all(cut == 0, axis=-1)
    np.testing.assert_array_equal(changed, blanked)
    rows, columns = np.nonzero(blanked)
    top, left = rows.min(), columns.min()
    height, width = rows.max() + 1 - top, columns.max() + 1 - left
    assert height * width == blanked.sum()  # One rectangle,
    # the square itself, or as much of it as falls on the image.
    assert height <= side and width <= side
    assert height == side or top == 0 or top + height == 24
    assert width == side or left == 0 or left + width == 24
    corners.add((top, left))
    areas.append(blanked.sum())
  assert len(corners) >= 40
  # Centred on a pixel drawn uniformly: on average this share of the image.
  inside = lambda c: min(c + side - side // 2, 24) - max(c - side // 2, 0)
  expected = np.mean([inside(c) for c in range(24)]) ** 2
  assert np.mean(areas) == pytest.approx(expected, rel=0.25)


def test_inputs_in_file_order_with_static_shapes(tmp_path):
  written = make_fake_data(str(tmp_path), records_per_file=12)
  with tf.Graph().as_default():
    images, labels = cifar10_input.inputs(True, str(tmp_path), batch_size=5)
    assert images.shape.as_list() == [5, 24, 24, 3]
    assert labels.shape.as_list() == [5]
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      got = np.concatenate([sess.run(labels) for _ in range(3)])
  expected = np.concatenate([written['test_batch.bin'][0]] * 2)[:15]
  np.testing.assert_array_equal(got, expected)


def test_distorted_batches_keep_labels_with_their_images_and_shuffle(
    tmp_path):
  written = make_fake_data(str(tmp_path), records_per_file=8)
  labels = np.concatenate([written[n][0] for n in cifar10_input.TRAIN_FILES])
  images = np.concatenate([written[n][1] for n in cifar10_input.TRAIN_FILES])
  with tf.Graph().as_default():
    batches = cifar10_input.distorted_batches(str(tmp_path), 6, 2)
    for batch_images, batch_labels in batches:
      assert batch_images.shape.as_list() == [6, 24, 24, 3]
      assert batch_labels.shape.as_list() == [6]
    with tf1.Session() as sess:
      got = sess.run(batches) + sess.run(batches)
  sources = []
  for batch_images, batch_labels in got:
    for out, label in zip(batch_images, batch_labels):
      index, _ = _source(out, images)
      assert label == labels[index]  # Its own label, not a neighbour's.
      sources.append(index)
  # 24 images from the 40 records, in no file order: shuffled.
  assert sources != sorted(sources) and len(set(sources)) >= 10, sources


def _two_steps_of_batches(data_dir, seed):
  """Two steps of 8 towers' distorted batches, in a graph seeded with seed
  (None: unseeded), from the pipeline's 16 parallel preprocessing calls.
  (Unless the towers take their batches in order, 8 take them in another
  order in nearly every graph.)"""
  with tf.Graph().as_default():
    tf1.set_random_seed(seed)
    batches = cifar10_input.distorted_batches(data_dir, 4, 8)
    with tf1.Session() as sess:
      return [sess.run(batches) for _ in range(2)]


def test_seeded_pipeline_repeats_order_distortions_and_towers(tmp_path):
  make_fake_data(str(tmp_path), records_per_file=8)
  first, again, other, unseeded = [
      _two_steps_of_batches(str(tmp_path), seed) for seed in (5, 5, 6, None)]
  for step, step_again in zip(first, again):
    for (images, labels), (images_again, labels_again) in zip(step,
                                                              step_again):
      np.testing.assert_array_equal(images, images_again)
      np.testing.assert_array_equal(labels, labels_again)
  for step, step_other, step_unseeded in zip(first, other, unseeded):
    for (images, _), (images_other, _), (images_unseeded, _) in zip(
        step, step_other, step_unseeded):
      assert not np.array_equal(images, images_other)
      assert not np.array_equal(images, images_unseeded)


def _one_batch(data_dir, mixup):
  """One distorted batch of 32 from a graph seeded with 3, with mixup's
  alpha (0: none)."""
  with tf.Graph().as_default():
    tf1.set_random_seed(3)
    batch = cifar10_input.distorted_inputs(data_dir, 32, mixup=mixup)
    with tf1.Session() as sess:
      return sess.run(batch)


def test_mixup_blends_each_image_and_label_with_the_one_opposite(tmp_path):
  """--mixup: the seeded batch without it, each image blended with the one
  opposite it in the batch by a share drawn for it, its label the same
  blend of the two labels; shares from Beta(alpha, alpha): near 0 or 1
  with a small alpha, spread out with alpha 1."""
  make_fake_data(str(tmp_path), records_per_file=8)
  images, labels = _one_batch(str(tmp_path), 0.0)
  assert labels.shape == (32,)  # The tutorial's labels without it.
  spread = {}
  for alpha in (0.2, 1.0):
    mixed, shares = _one_batch(str(tmp_path), alpha)
    assert shares.dtype == np.float32 and shares.shape == (32, 10)
    np.testing.assert_allclose(shares.sum(axis=1), 1, rtol=1e-6)
    own = []
    for i in range(32):
      partner = 31 - i
      # The share of itself, from the pixels (least squares).
      difference = (images[i] - images[partner]).ravel()
      share = np.dot(mixed[i].ravel() - images[partner].ravel(),
                     difference) / np.dot(difference, difference)
      assert 0 <= share <= 1
      np.testing.assert_allclose(
          mixed[i], share * images[i] + (1 - share) * images[partner],
          atol=1e-4)
      expected = np.zeros(10)
      expected[labels[i]] += share
      expected[labels[partner]] += 1 - share
      np.testing.assert_allclose(shares[i], expected, atol=1e-4)
      own.append(share)
    spread[alpha] = np.mean(np.minimum(own, 1 - np.array(own)))
  # Beta(a, a)'s mean distance to the nearer end: 0.10 at 0.2, 0.25 at 1
  # (over 32 draws, 0.03-0.18 and 0.17-0.33 in 999 batches of 1,000).
  assert 0.02 < spread[0.2] < 0.21 and 0.15 < spread[1.0] < 0.35, spread


_BUILD_PIPELINES = """
import glob, os, sys, tempfile
import tensorflow as tf
import cifar10_input
with tf.Graph().as_default():
  cifar10_input.distorted_inputs(sys.argv[1], 4, hold_out=True, cutout=8,
                                 mixup=0.2)
  cifar10_input.inputs(True, sys.argv[1], 4, held_out=False)
  print('written:', glob.glob(os.path.join(tempfile.gettempdir(), '*.py')))
"""


def test_pipelines_write_no_autograph_source_files(tmp_path):
  # AutoGraph writes each function it rewrites to a file in the temporary
  # directory, removed only at a clean exit: a killed trainer or evaluator
  # left them in /tmp. Listed before the process exits.
  make_fake_data(str(tmp_path / 'data'))
  temp = tmp_path / 'tmp'
  temp.mkdir()
  result = subprocess.run(
      [sys.executable, '-c', _BUILD_PIPELINES, str(tmp_path / 'data')],
      cwd=REPO, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, TMPDIR=str(temp)))
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'written: []' in result.stdout, result.stdout


def test_missing_file_names_it(tmp_path):
  make_fake_data(str(tmp_path))
  missing = os.path.join(str(tmp_path), 'cifar-10-batches-bin',
                         'data_batch_3.bin')
  os.remove(missing)
  with pytest.raises(errors.DataError, match='data_batch_3.bin'):
    cifar10_input.data_files(str(tmp_path), eval_data=False)


@pytest.mark.parametrize('size', [0, 3073 * 2 + 100])
def test_truncated_or_empty_file_names_it(tmp_path, size):
  make_fake_data(str(tmp_path))
  path = os.path.join(str(tmp_path), 'cifar-10-batches-bin', 'test_batch.bin')
  with open(path, 'r+b') as f:
    f.truncate(size)
  with pytest.raises(errors.DataError,
                     match=r'test_batch.bin has %d bytes' % size):
    cifar10_input.data_files(str(tmp_path), eval_data=True)


def test_bad_label_names_file_and_record(tmp_path):
  make_fake_data(str(tmp_path))
  path = os.path.join(str(tmp_path), 'cifar-10-batches-bin',
                      'data_batch_2.bin')
  images = np.zeros((5, 32, 32, 3), np.uint8)
  write_records(path, [1, 2, 3, 12, 4], images)
  with pytest.raises(errors.DataError,
                     match=r'data_batch_2.bin: record 3 has label byte 12'):
    cifar10_input.data_files(str(tmp_path), eval_data=False)


def test_oversized_file_is_refused_before_it_is_read(tmp_path, monkeypatch):
  # 10,001 records (a sparse file): whole records, but more than CIFAR-10
  # files hold. The size is checked first: nothing opens the file.
  make_fake_data(str(tmp_path))
  path = os.path.join(str(tmp_path), 'cifar-10-batches-bin', 'test_batch.bin')
  size = 10001 * cifar10_input.RECORD_BYTES
  with open(path, 'r+b') as f:
    f.truncate(size)

  def no_reading(*args, **kwargs):
    raise AssertionError('the file was opened: %s' % (args,))
  monkeypatch.setattr(tf.io.gfile, 'GFile', no_reading)
  with pytest.raises(errors.DataError,
                     match=r'test_batch.bin has %d bytes, .* up to '
                           r'30,730,000 bytes \(10,000 records\)' % size):
    cifar10_input.data_files(str(tmp_path), eval_data=True)
