"""Classifies your own images with the trained model; exports it as a SavedModel.

Restores the moving-average weights of the latest readable checkpoint in
--checkpoint_dir (as cifar10_eval.py does), brings every image to the
model's input the way the evaluator prepares the test images (any size:
scaled to 32x32 keeping the aspect ratio, then the central 24x24,
standardized) and prints one line per image: its path, then its
--top_k classes with their probabilities.

Usage:
  python cifar10_predict.py cat.png truck.jpg --checkpoint_dir=/tmp/cifar10_train
  cat.png: cat 0.578, dog 0.421, bird 0.001
  truck.jpg: truck 0.987, airplane 0.004, bird 0.002

Directories are walked for .jpg, .jpeg, .png, .bmp and .gif files. A file
that cannot be read or decoded gets one `Error:` line; the others are
still classified, and the exit status is 1.

  python cifar10_predict.py --export_dir=/tmp/cifar10_saved_model

writes a SavedModel whose 'serving_default' signature takes `images`, a
batch of encoded image files (strings), and returns `probabilities`
[batch, 10], `classes` (the top class) and `class_names`; it loads with
tf.saved_model.load and in TF Serving, without this repository. It is
built channels last (NHWC) and in float32 whatever the machine and the
flags, so that a model exported on a GPU machine runs on any CPU.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import os
import re
import shutil
import sys
import tempfile

import cifar10
import cifar10_input
from machinery import checkpoints
from machinery import cli
from machinery import console
from machinery import errors
from machinery import hardware
from machinery import options
from machinery import writes
import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
flags = tf1.flags
FLAGS = flags.FLAGS

flags.DEFINE_integer('top_k', 3, 'How many classes to print per image.',
                     lower_bound=1, upper_bound=cifar10.NUM_CLASSES)
flags.DEFINE_string('export_dir', None,
                    'Write a SavedModel of the moving-average model to this '
                    'new directory.')
checkpoints.define_checkpoint_dir_flag()
flags.declare_key_flag('checkpoint_dir')
flags.adopt_module_key_flags(cifar10)

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.gif')

# The side of a CIFAR-10 image, which an image file is scaled and cropped to.
SIDE = cifar10_input.HEIGHT

# TensorFlow's PNG decoder refuses width x height from 2^29 pixels on, and
# says so in these words.
PNG_MAX_PIXELS = 1 << 29
PNG_TOO_LARGE = re.compile(r'PNG size too large for int: (\d+) by (\d+)')


def image_paths(args):
  """Expands the command line's files and directories into image files.

  Args:
    args: paths of files and directories.

  Returns:
    paths: the files to classify, directories walked in sorted order.
    problems: one message for each directory without an image file.
  """
  paths, problems = [], []
  for arg in args:
    if not os.path.isdir(arg):
      paths.append(arg)
      continue
    found = sorted(
        os.path.join(root, name)
        for root, _, names in os.walk(arg) for name in names
        if name.lower().endswith(IMAGE_EXTENSIONS))
    if not found:
      problems.append('%s: no %s files in it.' % (arg, ', '.join(
          IMAGE_EXTENSIONS)))
    paths.extend(found)
  return paths, problems


def image_from_file(contents):
  """Brings an image file of any size to the model's input, as the
  evaluator's test images (cifar10_input.eval_image).

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
  image = tf.io.decode_image(contents, channels=cifar10_input.DEPTH,
                             dtype=tf.uint8, expand_animations=False)

  # Halve large images first: each bilinear halving averages 2x2 blocks, so
  # fine detail does not alias (with ops TFLite has). The first halving
  # reads the 8-bit pixels, so that a large image is never held whole in
  # float32 (4 bytes a value: 6 GB for TensorFlow's largest PNG).
  def halve(image):
    return tf.image.resize(image, tf.shape(image)[:2] // 2)
  large = tf.reduce_min(tf.shape(image)[:2]) >= 2 * SIDE
  image = tf.cond(large, lambda: halve(image),
                  lambda: tf.cast(image, tf.float32))
  image, = tf.while_loop(
      lambda image: tf.reduce_min(tf.shape(image)[:2]) >= 2 * SIDE, halve,
      [image], shape_invariants=[
          tf.TensorShape([None, None, cifar10_input.DEPTH])])
  size = tf.cast(tf.shape(image)[:2], tf.float32)
  scaled = tf.cast(tf.round(size * (SIDE / tf.reduce_min(size))), tf.int32)
  image = tf.cond(tf.reduce_all(tf.equal(scaled, tf.shape(image)[:2])),
                  lambda: image, lambda: tf.image.resize(image, scaled))
  image = tf.image.resize_with_crop_or_pad(image, SIDE, SIDE)
  return cifar10_input.eval_image(image)


class Classifier(object):
  """Classifies encoded images with the model's moving-average weights.

  Attributes:
    images: the [batch] string placeholder of encoded image files.
    outputs: {'probabilities', 'classes', 'class_names'} tensors.
    session: the session holding the restored weights.
  """

  def __init__(self, checkpoint_path, opts=options.DEFAULT):
    """Builds the model and restores its weights.

    Args:
      checkpoint_path: the checkpoint to restore.
      opts: the options for speed it is built with, a
        machinery.options.Options; options.PORTABLE builds it as every CPU
        build of TensorFlow runs it (for export).
    """
    self.graph = tf.Graph()
    with self.graph.as_default():
      self.images = tf1.placeholder(tf.string, [None], name='images')
      # Each file decoded and prepared as the evaluator's test images, on
      # the CPU, like the evaluator's input pipeline.
      with tf.device('/cpu:0'):
        images = tf.map_fn(image_from_file, self.images,
                           fn_output_signature=tf.float32)
      logits = tf.cast(cifar10.inference(
          tf.cast(images, opts.compute_dtype()), opts), tf.float32)
      classes = tf.argmax(logits, axis=1, name='classes')
      self.outputs = {
          'probabilities': tf.nn.softmax(logits, name='probabilities'),
          'classes': classes,
          'class_names': tf.gather(tf.constant(cifar10_input.CLASS_NAMES),
                                   classes, name='class_names'),
      }
      # The moving averages of the trained variables, restored into them:
      # the weights the evaluator measures.
      variables = cifar10.averaged_weights()
      checkpoints.check_checkpoint(checkpoint_path, variables)
      self.session = tf1.Session(config=hardware.session_config())
      tf1.train.Saver(variables).restore(self.session, checkpoint_path)

  def probabilities(self, contents):
    """Returns the [len(contents), 10] probabilities of encoded images."""
    return self.session.run(self.outputs['probabilities'],
                            {self.images: contents})

  def export(self, export_dir):
    """Writes the model as a SavedModel, whole or not at all: it is built
    in a directory beside export_dir and renamed into place.

    Args:
      export_dir: a directory that does not exist yet.

    Raises:
      errors.WriteError: a write failed (nothing is left behind).
    """
    parent = os.path.dirname(os.path.abspath(export_dir))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix='.export-', dir=parent)
    try:
      # Without TF2's notes that these are TF1 APIs.
      with writes.as_write_error(
          'export_dir', export_dir, then='Nothing was left there.',
          written_in=staging, what='the SavedModel to ' + export_dir), \
          console.quiet_tf_logging(), self.graph.as_default():
        builder = tf1.saved_model.Builder(os.path.join(staging, 'model'))
        signature = tf1.saved_model.predict_signature_def(
            inputs={'images': self.images}, outputs=self.outputs)
        builder.add_meta_graph_and_variables(
            self.session, [tf1.saved_model.SERVING], strip_default_attrs=True,
            signature_def_map={'serving_default': signature})
        builder.save()
        os.rename(os.path.join(staging, 'model'), export_dir)
    finally:
      shutil.rmtree(staging, ignore_errors=True)


def _read(path):
  """Returns a file's bytes, or raises IOError with a short reason."""
  try:
    with tf.io.gfile.GFile(path, 'rb') as f:
      return f.read()
  except tf.errors.OpError as e:
    raise IOError(e.message.split(';')[-1].strip())


def _undecodable(batch):
  """Finds batch's files that TensorFlow cannot decode, and why.

  Args:
    batch: (path, contents) pairs.

  Returns:
    {path: why, a phrase} of each file that does not decode.
  """
  undecodable = {}
  with tf.Graph().as_default():
    contents = tf1.placeholder(tf.string, [])
    image = image_from_file(contents)
    with tf1.Session(config=tf1.ConfigProto(device_count={'GPU': 0})) as sess:
      for path, one_file in batch:
        try:
          sess.run(image, {contents: one_file})
        except tf.errors.InvalidArgumentError as e:  # How a decoder refuses.
          undecodable[path] = _why_undecodable(errors.tf_reason(e))
  return undecodable


def _why_undecodable(reason):
  """Words why an image file does not decode, from TensorFlow's reason."""
  too_large = PNG_TOO_LARGE.search(reason)
  if too_large:
    return ('a PNG of %s x %s pixels, too large to decode: TensorFlow '
            'decodes PNGs of fewer than %s pixels (2^29; a square of at most '
            '23,170 x 23,170). Scale it down first'
            % (too_large.group(1), too_large.group(2),
               format(PNG_MAX_PIXELS, ',')))
  if 'too large' in reason.lower():
    return 'too large to decode (%s)' % reason
  return 'not an image TensorFlow can decode (JPEG, PNG, BMP or GIF)'


def _model_failed(error):
  """Makes the ModelError of a model that failed on images that decode."""
  # The flags that change how the model is built, as given.
  changed = ['--%s=%s' % (name, getattr(FLAGS, name))
             for name in sorted(options.BUILD_FLAGS) if FLAGS[name].present]
  return errors.ModelError(
      'The model failed on images that decode: %s. %s' % (
          errors.tf_reason(error),
          'It was built with %s: run without %s.' % (
              ' '.join(changed), 'it' if len(changed) == 1 else 'them')
          if changed else 'The checkpoint or this TensorFlow is at fault.'))


def _probabilities(classifier, batch):
  """Classifies the files of a batch that decode.

  Args:
    classifier: the Classifier.
    batch: (path, contents) pairs.

  Returns:
    {path: probabilities} of each file that decodes, and {path: why} of
    each that does not.

  Raises:
    errors.ModelError: the model failed on images that decode.
  """
  try:
    return dict(zip([p for p, _ in batch], classifier.probabilities(
        [c for _, c in batch]))), {}
  except tf.errors.OpError as e:
    undecodable = _undecodable(batch)
    if not undecodable:
      raise _model_failed(e)
  decodable = [(p, c) for p, c in batch if p not in undecodable]
  if not decodable:
    return {}, undecodable
  try:
    return dict(zip([p for p, _ in decodable], classifier.probabilities(
        [c for _, c in decodable]))), undecodable
  except tf.errors.OpError as e:
    raise _model_failed(e)


def classify(classifier, paths):
  """Prints each image's top classes, --batch_size images at a time.

  Args:
    classifier: the Classifier.
    paths: image files.

  Returns:
    The number of files that could not be read or decoded.

  Raises:
    errors.ModelError: the model failed on images that decode.
  """
  failed = 0
  for start in range(0, len(paths), FLAGS.batch_size):
    batch = []
    for path in paths[start:start + FLAGS.batch_size]:
      try:
        batch.append((path, _read(path)))
      except IOError as e:
        sys.stderr.write('Error: %s: cannot read it: %s.\n' % (path, e))
        failed += 1
    if not batch:
      continue
    results, undecodable = _probabilities(classifier, batch)
    for path, _ in batch:  # In the order given.
      if path not in results:
        sys.stdout.flush()
        sys.stderr.write('Error: %s: %s.\n' % (path, undecodable[path]))
        failed += 1
        continue
      probabilities = results[path]
      top = np.argsort(-probabilities, kind='stable')[:FLAGS.top_k]
      print('%s: %s' % (path, ', '.join(
          '%s %.3f' % (cifar10_input.CLASS_NAMES[c], probabilities[c])
          for c in top)))
    sys.stdout.flush()
  return failed


def main(argv):
  paths, problems = image_paths(argv[1:])
  if not paths and not FLAGS.export_dir:
    raise errors.UsageError(
        'Give image files or directories to classify, or --export_dir.%s'
        % (' ' + ' '.join(problems) if problems else ''))
  if FLAGS.export_dir and tf.io.gfile.exists(FLAGS.export_dir):
    raise errors.UsageError(
        '--export_dir=%s exists: give a new directory for the SavedModel.'
        % FLAGS.export_dir)
  latest = checkpoints.latest_checkpoint(FLAGS.checkpoint_dir)
  for line in checkpoints.notes(latest, 'Using %s.' % latest.path):
    sys.stderr.write(line + '\n')
  checkpoint_path = latest.path
  if checkpoint_path is None:
    raise errors.CheckpointError(
        'No checkpoint file found in %s. Train first (cifar10_train.py) or '
        'give --checkpoint_dir.' % FLAGS.checkpoint_dir)
  for problem in problems:
    sys.stderr.write('Error: %s\n' % problem)
  failed = len(problems)
  if paths:
    failed += classify(Classifier(checkpoint_path, options.from_flags()),
                       paths)
  if FLAGS.export_dir:
    Classifier(checkpoint_path, options.PORTABLE).export(FLAGS.export_dir)
    print('Exported the model of %s to %s.' % (checkpoint_path,
                                               FLAGS.export_dir))
  return 1 if failed else 0


if __name__ == '__main__':
  cli.run_main(main, takes_arguments=True)
