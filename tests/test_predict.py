"""cifar10_predict.py: the user's images classified as the evaluator would,
one line per bad file, and an exported SavedModel that stands alone."""

import json
import os
import re
import struct
import subprocess
import sys
import zlib

from absl.testing import flagsaver
import numpy as np
from PIL import Image
import pytest
import tensorflow as tf

import cifar10
import cifar10_eval
import cifar10_input
from conftest import error_lines, run_script, script_env, trained_run
from machinery import options

tf1 = tf.compat.v1

NUM_IMAGES = 40
LINE = re.compile(r'^(\S+): (\w+) (\d\.\d{3}), (\w+) (\d\.\d{3}), '
                  r'(\w+) (\d\.\d{3})$', re.M)


@pytest.fixture(scope='module')
def checkpoint_dir(real_data_dir, tmp_path_factory):
  return trained_run(tmp_path_factory, real_data_dir, '--batch_size=32',
                     '--max_steps=80')


@pytest.fixture(scope='module')
def test_records(real_data_dir):
  """The first test records: (labels, uint8 [n, 32, 32, 3] images)."""
  path = os.path.join(real_data_dir, cifar10_input.BATCHES_DIR,
                      cifar10_input.TEST_FILES[0])
  records = np.fromfile(path, dtype=np.uint8).reshape(
      -1, cifar10_input.RECORD_BYTES)[:NUM_IMAGES]
  images = records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
  return records[:, 0], images


@pytest.fixture(scope='module')
def evaluator_probabilities(real_data_dir, checkpoint_dir):
  """The evaluator's graph on the same records: softmax of its logits."""
  with tf.Graph().as_default():
    images, _ = cifar10.inputs(True, real_data_dir, NUM_IMAGES)
    logits = cifar10.inference(images)
    saver = tf1.train.Saver(cifar10_eval.weights_to_restore(False))
    with tf1.Session() as sess:
      saver.restore(sess, tf.train.latest_checkpoint(checkpoint_dir))
      return sess.run(tf.nn.softmax(tf.cast(logits, tf.float32)))


@pytest.fixture(scope='module')
def png_dir(test_records, tmp_path_factory):
  directory = tmp_path_factory.mktemp('pngs')
  for i, image in enumerate(test_records[1]):
    Image.fromarray(image).save(str(directory / ('%02d.png' % i)))
  return str(directory)


def _predictions(stdout):
  """{path: [(class name, probability)] * 3} from the script's lines."""
  return {m.group(1): [(m.group(i), float(m.group(i + 1)))
                       for i in (2, 4, 6)]
          for m in LINE.finditer(stdout)}


def _blank_png(path, width, height):
  """Writes a black RGB PNG of width x height pixels, compressed small (a
  40000 x 40000 one is 4.7 MB), run-length encoded: its 4.8 GB of zero
  pixels deflate in half the time the default strategy takes."""
  def chunk(kind, data):
    return (struct.pack('>I', len(data)) + kind + data +
            struct.pack('>I', zlib.crc32(kind + data) & 0xffffffff))
  deflate = zlib.compressobj(9, zlib.DEFLATED, 15, 9, zlib.Z_RLE)
  row = b'\x00' * (1 + 3 * width)  # Filter 0, then the pixels.
  pixels = b''.join(deflate.compress(row) for _ in range(height))
  with open(path, 'wb') as f:
    f.write(b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack(
        '>IIBBBBB', width, height, 8, 2, 0, 0, 0)) +
            chunk(b'IDAT', pixels + deflate.flush()) + chunk(b'IEND', b''))


def test_classifies_as_the_evaluator_and_names_bad_files(
    checkpoint_dir, png_dir, evaluator_probabilities, tmp_path):
  not_image = tmp_path / 'notes.png'
  not_image.write_text('not an image')
  missing = str(tmp_path / 'missing.jpg')
  too_large = str(tmp_path / 'too_large.png')
  _blank_png(too_large, 40000, 40000)
  result = run_script('cifar10_predict.py', png_dir, str(not_image), missing,
                      too_large, '--checkpoint_dir=' + checkpoint_dir,
                      '--batch_size=16')
  assert result.returncode == 1
  assert sorted(error_lines(result.stderr)) == sorted([
      'Error: %s: cannot read it: No such file or directory.' % missing,
      'Error: %s: not an image TensorFlow can decode (JPEG, PNG, BMP or '
      'GIF).' % not_image,
      'Error: %s: a PNG of 40000 x 40000 pixels, too large to decode: '
      'TensorFlow decodes PNGs of fewer than 536,870,912 pixels (2^29; a '
      'square of at most 23,170 x 23,170). Scale it down first.' % too_large])
  predictions = _predictions(result.stdout)
  assert len(predictions) == NUM_IMAGES
  for i in range(NUM_IMAGES):
    top = predictions[os.path.join(png_dir, '%02d.png' % i)]
    expected = evaluator_probabilities[i]
    assert top[0][0] == cifar10_input.CLASS_NAMES[np.argmax(expected)]
    for name, probability in top:
      assert probability == pytest.approx(
          expected[cifar10_input.CLASS_NAMES.index(name)], abs=6e-4)


def _block_upscaled(image, factor):
  """image with every pixel repeated factor x factor times."""
  return np.repeat(np.repeat(image, factor, axis=0), factor, axis=1)


def test_any_size_and_format(checkpoint_dir, test_records,
                             evaluator_probabilities, tmp_path):
  image = test_records[1][0]
  # Keeping the aspect ratio, the shorter side is brought to 32 and the
  # central 32x32 taken: these are the test image again, exactly. Each
  # bilinear halving of a block-upscaled image averages equal pixels.
  wide = np.concatenate([np.zeros((32, 8, 3), np.uint8), image,
                         np.full((32, 8, 3), 255, np.uint8)], axis=1)
  same = {'upscaled.png': _block_upscaled(image, 4),  # 128x128.
          'wide.png': wide,  # 32x48: the crop cuts the bands off.
          'wide_upscaled.png': _block_upscaled(wide, 2)}  # 64x96.
  other = {'big.jpg': Image.fromarray(image).resize((640, 480),
                                                    Image.BILINEAR),
           'grey.jpg': Image.fromarray(image).convert('L'),
           'rgba.png': Image.fromarray(image).convert('RGBA'),
           'image.bmp': Image.fromarray(image),
           'image.gif': Image.fromarray(image),
           'tiny.png': Image.fromarray(image).resize((16, 12))}
  for name, picture in same.items():
    Image.fromarray(picture).save(str(tmp_path / name))
  for name, picture in other.items():
    picture.save(str(tmp_path / name))
  result = run_script('cifar10_predict.py', str(tmp_path), '--top_k=10',
                      '--checkpoint_dir=' + checkpoint_dir)
  assert result.returncode == 0, result.stderr[-2000:]
  lines = dict(line.split(': ', 1) for line in result.stdout.splitlines()
               if ': ' in line)
  assert sorted(os.path.basename(p) for p in lines) == sorted(
      list(same) + list(other))
  expected = evaluator_probabilities[0]
  for name in same:
    top = [(n, float(p)) for n, p in (
        item.split() for item in lines[str(tmp_path / name)].split(', '))]
    # All 10 classes, most probable first, as the evaluator sees image 0.
    assert [n for n, _ in top] == [cifar10_input.CLASS_NAMES[c] for c in
                                   np.argsort(-expected, kind='stable')], name
    for class_name, probability in top:
      assert probability == pytest.approx(
          expected[cifar10_input.CLASS_NAMES.index(class_name)], abs=6e-4)
  # The same pixels, losslessly, classify the same.
  assert lines[str(tmp_path / 'rgba.png')] == lines[str(tmp_path /
                                                         'image.bmp')]


@pytest.mark.parametrize('top_k', [1, 5])
def test_top_k_prints_that_many_classes(checkpoint_dir, png_dir,
                                        evaluator_probabilities, top_k):
  result = run_script('cifar10_predict.py',
                      os.path.join(png_dir, '00.png'),
                      os.path.join(png_dir, '01.png'), '--top_k=%d' % top_k,
                      '--checkpoint_dir=' + checkpoint_dir)
  assert result.returncode == 0, result.stderr[-2000:]
  for i, line in enumerate(result.stdout.strip().splitlines()):
    path, classes = line.split(': ')
    assert path == os.path.join(png_dir, '%02d.png' % i)
    names = [item.split()[0] for item in classes.split(', ')]
    assert names == [cifar10_input.CLASS_NAMES[c] for c in np.argsort(
        -evaluator_probabilities[i], kind='stable')[:top_k]]


def test_nothing_to_do_is_one_line(checkpoint_dir, tmp_path):
  result = run_script('cifar10_predict.py', str(tmp_path),
                      '--checkpoint_dir=' + checkpoint_dir)
  assert result.returncode == 1
  assert error_lines(result.stderr) == [
      'Error: Give image files or directories to classify, or --export_dir. '
      '%s: no .jpg, .jpeg, .png, .bmp, .gif files in it.' % tmp_path]


# Loads the SavedModel in eager TensorFlow 2, as a user without this
# repository would, and converts it for TFLite.
LOAD = """
import json, sys
import tensorflow as tf
classify = tf.saved_model.load(sys.argv[1]).signatures['serving_default']
files = [open(path, 'rb').read() for path in sys.argv[2:]]
out = classify(images=tf.constant(files))
converter = tf.lite.TFLiteConverter.from_saved_model(sys.argv[1])
converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS,
                                       tf.lite.OpsSet.SELECT_TF_OPS]
print(json.dumps({'probabilities': out['probabilities'].numpy().tolist(),
                  'classes': out['classes'].numpy().tolist(),
                  'class_names': [n.decode() for n in out['class_names'].numpy()],
                  'tflite_bytes': len(converter.convert())}))
"""


def test_exported_saved_model_stands_alone(checkpoint_dir, png_dir,
                                           evaluator_probabilities, tmp_path):
  export_dir = str(tmp_path / 'saved_model')
  result = run_script('cifar10_predict.py', '--export_dir=' + export_dir,
                      '--checkpoint_dir=' + checkpoint_dir)
  assert result.returncode == 0, result.stderr[-2000:]
  assert os.path.exists(os.path.join(export_dir, 'saved_model.pb'))
  again = run_script('cifar10_predict.py', '--export_dir=' + export_dir,
                     '--checkpoint_dir=' + checkpoint_dir)
  assert error_lines(again.stderr) == [
      'Error: --export_dir=%s exists: give a new directory for the '
      'SavedModel.' % export_dir]

  paths = [os.path.join(png_dir, '%02d.png' % i) for i in range(NUM_IMAGES)]
  loaded = subprocess.run([sys.executable, '-c', LOAD, export_dir] + paths,
                          cwd=str(tmp_path), capture_output=True, text=True,
                          timeout=600, env=script_env())
  assert loaded.returncode == 0, loaded.stderr[-3000:]
  out = json.loads(loaded.stdout.splitlines()[-1])
  np.testing.assert_allclose(out['probabilities'], evaluator_probabilities,
                             atol=1e-5)
  assert out['classes'] == np.argmax(evaluator_probabilities, 1).tolist()
  assert out['class_names'] == [cifar10_input.CLASS_NAMES[c]
                                for c in out['classes']]
  assert out['tflite_bytes'] > 1000000


def _layouts_and_types(graph_def):
  """The data_format values and the tensor types a graph's nodes use."""
  formats, types = set(), set()
  for node in list(graph_def.node) + [n for f in graph_def.library.function
                                      for n in f.node_def]:
    if 'data_format' in node.attr:
      formats.add(node.attr['data_format'].s.decode())
    for value in node.attr.values():
      if value.type:
        types.add(tf.dtypes.as_dtype(value.type).name)
  return formats, types


def test_export_is_nhwc_float32_whatever_the_flags(
    checkpoint_dir, png_dir, evaluator_probabilities, tmp_path):
  import cifar10_predict  # pylint: disable=g-import-not-at-top
  export_dir = str(tmp_path / 'portable')
  checkpoint = tf.train.latest_checkpoint(checkpoint_dir)
  # As on a GPU machine: NCHW, mixed precision and XLA asked for.
  asked = options.Options(use_fp16=False, use_bf16=True,
                          loss_scale_value='dynamic', layout='NCHW', xla=True)
  cifar10_predict.Classifier(checkpoint, options.PORTABLE).export(export_dir)
  asked = cifar10_predict.Classifier(checkpoint, asked).graph.as_graph_def()
  formats, types = _layouts_and_types(asked)
  assert 'NCHW' in formats and 'bfloat16' in types  # What was asked for.

  with tf.Graph().as_default(), tf1.Session() as sess:
    exported = tf1.saved_model.load(sess, ['serve'], export_dir).graph_def
  formats, types = _layouts_and_types(exported)
  assert formats == {'NHWC'}, formats
  assert not types & {'bfloat16', 'float16'}, types
  assert not [n.name for n in exported.node if '_XlaCompile' in n.attr]

  # It classifies on the CPU alone, as the evaluator does.
  paths = [os.path.join(png_dir, '%02d.png' % i) for i in range(NUM_IMAGES)]
  loaded = subprocess.run([sys.executable, '-c', LOAD, export_dir] + paths,
                          cwd=str(tmp_path), capture_output=True, text=True,
                          timeout=600,
                          env=script_env(dict(os.environ,
                                              CUDA_VISIBLE_DEVICES='')))
  assert loaded.returncode == 0, loaded.stderr[-3000:]
  out = json.loads(loaded.stdout.splitlines()[-1])
  np.testing.assert_allclose(out['probabilities'], evaluator_probabilities,
                             atol=1e-5)


def test_images_are_decoded_on_the_cpu(checkpoint_dir):
  import cifar10_predict  # pylint: disable=g-import-not-at-top
  classifier = cifar10_predict.Classifier(
      tf.train.latest_checkpoint(checkpoint_dir))
  classifier.session.close()
  decoders = [op for op in classifier.graph.get_operations()
              if 'While' in op.type or op.type.startswith('Decode')]
  assert decoders  # The map over the files, and the decoders in it.
  for op in decoders:
    assert op.device.upper().endswith('CPU:0'), (op.name, op.device)


def test_a_model_failure_is_one_line_with_tensorflows_reason(
    checkpoint_dir, png_dir, tmp_path, monkeypatch, parsed_flags):
  """Only a failed decode says 'not an image': here every image decodes
  and the model fails (logits made infinite, which check_numerics
  refuses), as a kernel the machine lacks would."""
  import cifar10_predict  # pylint: disable=g-import-not-at-top
  from machinery import errors  # pylint: disable=g-import-not-at-top
  real_inference = cifar10.inference
  monkeypatch.setattr(cifar10, 'inference', lambda images, opts: (
      tf.debugging.check_numerics(real_inference(images, opts) * np.inf,
                                  'the logits')))
  classifier = cifar10_predict.Classifier(
      tf.train.latest_checkpoint(checkpoint_dir))
  bad = tmp_path / 'bad.png'
  bad.write_bytes(b'not an image')
  paths = [os.path.join(png_dir, '00.png'), str(bad)]
  monkeypatch.setattr(tf.compat.v1.flags.FLAGS['use_bf16'], 'present', 1)
  with flagsaver.flagsaver(batch_size=2, use_bf16=True):
    with pytest.raises(errors.ModelError) as error:
      cifar10_predict.classify(classifier, paths)
  assert str(error.value).startswith(
      'The model failed on images that decode: the logits : Tensor had Inf '
      'values'), str(error.value)
  assert str(error.value).endswith(
      'It was built with --use_bf16=True: run without it.')
