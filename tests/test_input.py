"""The input pipeline, on records the tests write themselves."""

import os

import numpy as np
import pytest
import tensorflow as tf

import cifar10_input
from conftest import make_fake_data, write_records

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


def test_distort_image_is_random_crop_flip_and_standardized():
  image = np.random.RandomState(1).randint(0, 256, (32, 32, 3))
  with tf.Graph().as_default():
    distorted = cifar10_input.distort_image(tf.constant(image, tf.float32))
    with tf1.Session() as sess:
      outs = [sess.run(distorted) for _ in range(20)]
  for out in outs:
    assert out.shape == (24, 24, 3)
    assert abs(out.mean()) < 1e-4 and out.std() == pytest.approx(1, abs=1e-3)
  # Different crops, flips and colour changes from run to run.
  assert len({o.tobytes() for o in outs}) == 20
  # Each output is one of the 81 crops, maybe flipped, with brightness,
  # contrast and standardization applied on top.
  windows = [image[y:y + 24, x:x + 24] for y in range(9) for x in range(9)]
  for out in outs:
    matched = False
    for w in windows:
      for cand in (w, w[:, ::-1]):
        flat_out = out.reshape(-1, 3)
        flat_in = cand.reshape(-1, 3).astype(np.float64)
        # A contrast change scales each channel about its mean, and
        # brightness shifts all alike: per channel, out is an increasing
        # affine function of the input, so the orders agree.
        if all(np.array_equal(np.argsort(flat_out[:, c], kind='stable'),
                              np.argsort(flat_in[:, c], kind='stable'))
               for c in range(3)):
          matched = True
          break
      if matched:
        break
    assert matched


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


def test_distorted_inputs_shapes_labels_and_distinct_batches(tmp_path):
  written = make_fake_data(str(tmp_path), records_per_file=8)
  all_labels = set()
  for name in cifar10_input.TRAIN_FILES:
    all_labels.update(written[name][0].tolist())
  with tf.Graph().as_default():
    batches = cifar10_input.distorted_batches(str(tmp_path), 6, 2)
    for images, labels in batches:
      assert images.shape.as_list() == [6, 24, 24, 3]
      assert labels.shape.as_list() == [6]
    with tf1.Session() as sess:
      (i0, l0), (i1, l1) = sess.run(batches)
  assert set(l0.tolist()) | set(l1.tolist()) <= all_labels
  assert not np.array_equal(i0, i1)


def test_missing_file_names_it(tmp_path):
  make_fake_data(str(tmp_path))
  missing = os.path.join(str(tmp_path), 'cifar-10-batches-bin',
                         'data_batch_3.bin')
  os.remove(missing)
  with pytest.raises(cifar10_input.DataError, match='data_batch_3.bin'):
    cifar10_input.data_files(str(tmp_path), eval_data=False)


@pytest.mark.parametrize('size', [0, 3073 * 2 + 100])
def test_truncated_or_empty_file_names_it(tmp_path, size):
  make_fake_data(str(tmp_path))
  path = os.path.join(str(tmp_path), 'cifar-10-batches-bin', 'test_batch.bin')
  with open(path, 'r+b') as f:
    f.truncate(size)
  with pytest.raises(cifar10_input.DataError,
                     match=r'test_batch.bin has %d bytes' % size):
    cifar10_input.data_files(str(tmp_path), eval_data=True)


def test_bad_label_names_file_and_record(tmp_path):
  make_fake_data(str(tmp_path))
  path = os.path.join(str(tmp_path), 'cifar-10-batches-bin',
                      'data_batch_2.bin')
  images = np.zeros((5, 32, 32, 3), np.uint8)
  write_records(path, [1, 2, 3, 12, 4], images)
  with pytest.raises(cifar10_input.DataError,
                     match=r'data_batch_2.bin: record 3 has label byte 12'):
    cifar10_input.data_files(str(tmp_path), eval_data=False)
