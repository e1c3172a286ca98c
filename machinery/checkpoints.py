"""Finds the checkpoint the trainers resume from and the evaluator and
cifar10_predict.py restore, and checks that it is this model's.

A run directory (--train_dir) holds the checkpoints model.ckpt-N (an
.index file and .data-*-of-* files each) and the `checkpoint` index file
that names the latest. The trainers record paths in it relative to the
directory, so a run directory can be moved, copied or mounted anywhere.

What counts as the latest checkpoint is what is on disk and readable, not
only what the index file says: latest_checkpoint() looks at every
checkpoint the index file names (an absolute path to a place that no
longer exists is looked for by its file name in the directory, as older
versions wrote them) and every checkpoint file in the directory, newest
step first, and returns the first whose files are all present, read back
with their checksums and hold finite values. The ones it passes over come
with the reason:

  latest = latest_checkpoint('/data/run')
  latest.path         # '/data/run/model.ckpt-10'
  latest.passed_over  # [('/data/run/model.ckpt-20', 'its data file ...')]
  latest.outside      # ['/old/run/model.ckpt-5']: named, not in /data/run
  step = check_checkpoint(latest.path, saver_var_list)  # This model's?

Only checkpoints inside the directory count: an index file that names
others (an absolute path, as TensorFlow 1 wrote them, or ../) has those
entries left out, so that no saver ever rotates, that is deletes, a file
outside its --train_dir.

Readers only read. A trainer about to resume calls prepare_resume(), which
also moves the files of the checkpoints it passes over (and an unreadable
index file) into <train_dir>/set_aside/, where the saver cannot overwrite
them, and rewrites the index file with relative paths, naming nothing
outside. Nothing is deleted.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import collections
import os
import re

from machinery import console
from machinery import errors
import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
flags = tf1.flags
FLAGS = flags.FLAGS

# The index file that names the latest checkpoint of a directory.
INDEX_FILE = 'checkpoint'

# Where a trainer moves the files of checkpoints it cannot resume from.
SET_ASIDE_DIR = 'set_aside'

# A checkpoint file: <prefix>.index or <prefix>.data-00000-of-00001, where
# the prefix ends in -<global step> (model.ckpt-1000).
_CHECKPOINT_FILE = re.compile(
    r'^(?P<prefix>.+-(?P<step>\d+))\.(?:index|data-\d+-of-(?P<shards>\d+))$')

Latest = collections.namedtuple('Latest', ['directory', 'path',
                                           'passed_over', 'index_problem',
                                           'outside'])
Latest.__doc__ = """Holds the latest readable checkpoint of a directory.

Attributes:
  directory: the directory looked in.
  path: its path prefix, or None when the directory holds no checkpoint.
  passed_over: (path, reason) of each newer checkpoint that is not
    readable, newest first.
  index_problem: why the index file could not be used, or None.
  outside: the paths of the checkpoints the index file names outside the
    directory, left out.
"""


def define_checkpoint_dir_flag():
  """Defines --checkpoint_dir, the flag of the scripts that read a
  trainer's checkpoints (the evaluator, cifar10_predict.py)."""
  if 'checkpoint_dir' in FLAGS:
    return  # Both scripts imported into one process (tests).
  flags.DEFINE_string('checkpoint_dir', '/tmp/cifar10_train',
                      'Directory where to read model checkpoints.')


def step_of(path):
  """Returns the global step in a checkpoint's name (model.ckpt-N), or -1."""
  match = re.search(r'-(\d+)$', path)
  return int(match.group(1)) if match else -1


def _read_index_file(directory):
  """Reads the checkpoint paths the index file names.

  Returns:
    (paths, outside, problem): the paths in directory, oldest first, made
    absolute and looked for in directory by their file names where they
    do not exist as written; the paths of those outside it;
    and None, or why the index file cannot be used.
  """
  filename = os.path.join(directory, INDEX_FILE)
  if not tf.io.gfile.exists(filename):
    return [], [], None
  try:
    with console.quiet_tf_logging():  # Its own 'Checkpoint ignored' lines.
      state = tf1.train.get_checkpoint_state(directory)
  except ValueError:
    state = None
  if state is None:
    return [], [], ('the index file %s is unreadable (not a checkpoint '
                    'state)' % filename)
  paths = list(state.all_model_checkpoint_paths)
  if state.model_checkpoint_path not in paths:
    paths.append(state.model_checkpoint_path)
  found, outside = [], []
  for path in paths:
    # Older versions wrote absolute paths: the directory may have been
    # moved or copied since. Its own files are the ones to use.
    here = os.path.join(directory, os.path.basename(path))
    if _files_of(here) or _in_directory(path, directory):
      found.append(here)
    else:
      outside.append(path if '://' in path else os.path.normpath(path))
  return found, outside, None


def _in_directory(path, directory):
  """Tells whether path (made absolute by get_checkpoint_state) names a
  file in directory itself, after resolving any '..'."""
  def resolved(p):
    return os.path.normpath(p if '://' in p else os.path.abspath(p))
  return os.path.dirname(resolved(path)) == resolved(directory)


def _files_of(prefix, meta=False):
  """Returns the files of checkpoint prefix that exist: its .index and data
  files, and its .meta graph if meta."""
  return sorted(tf.io.gfile.glob(prefix + '.index') +
                tf.io.gfile.glob(prefix + '.data-*-of-*') +
                (tf.io.gfile.glob(prefix + '.meta') if meta else []))


def _scan(directory):
  """Returns the prefixes of the checkpoint files in directory."""
  prefixes = set()
  for name in tf.io.gfile.listdir(directory):
    match = _CHECKPOINT_FILE.match(name)
    if match:
      prefixes.add(os.path.join(directory, match.group('prefix')))
  return prefixes


def unreadable_reason(prefix):
  """Tells why a checkpoint cannot be restored, or None if it can.

  Reads every value back (the reader checks each one's checksum) and
  checks that the floating-point ones are finite.

  Args:
    prefix: the checkpoint's path prefix, e.g. '/tmp/run/model.ckpt-10'.

  Returns:
    None, or the reason as a phrase.
  """
  name = os.path.basename(prefix)
  if not tf.io.gfile.exists(prefix + '.index'):
    if _files_of(prefix):
      return 'its index file %s.index is missing' % name
    return 'its files are missing'
  data = tf.io.gfile.glob(prefix + '.data-*-of-*')
  shards = [int(_CHECKPOINT_FILE.match(os.path.basename(f)).group('shards'))
            for f in data if _CHECKPOINT_FILE.match(os.path.basename(f))]
  if not data or len(data) < max(shards):
    return 'its data file %s.data-*-of-* is missing' % name
  try:
    reader = tf.train.load_checkpoint(prefix)
  except tf.errors.OpError as e:  # Damaged, or not a file: the reason says.
    return 'its index file %s.index cannot be read (%s)' % (
        name, errors.tf_reason(e))
  try:
    for var_name, dtype in reader.get_variable_to_dtype_map().items():
      value = reader.get_tensor(var_name)
      if dtype.is_floating and not np.all(np.isfinite(value)):
        return ('it holds NaN or infinite values (%s): training had '
                'diverged' % var_name)
  except IndexError as e:  # OUT_OF_RANGE: the file ends before the data.
    return 'its data is cut short (%s)' % errors.tf_reason(e)
  except tf.errors.OpError as e:  # A checksum that does not match, ...
    return 'its data cannot be read (%s)' % errors.tf_reason(e)
  return None


def latest_checkpoint(directory):
  """Finds the newest readable checkpoint of a directory; writes nothing.

  Args:
    directory: a run directory (--train_dir, --checkpoint_dir).

  Returns:
    A Latest: path None if the directory holds no checkpoint at all.

  Raises:
    errors.CheckpointError: it holds checkpoints, but none is readable.
  """
  if not tf.io.gfile.isdir(directory):
    return Latest(directory, None, [], None, [])
  named, outside, index_problem = _read_index_file(directory)
  candidates = set(named) | _scan(directory)
  # Newest first: by the step in the name, then by the index file's order.
  order = {path: i for i, path in enumerate(named)}
  candidates = sorted(candidates, reverse=True,
                      key=lambda p: (step_of(p), order.get(p, -1)))
  passed_over = []
  for path in candidates:
    reason = unreadable_reason(path)
    if reason is None:
      return Latest(directory, path, passed_over, index_problem, outside)
    passed_over.append((path, reason))
  if not passed_over:
    return Latest(directory, None, [], index_problem, outside)
  raise errors.CheckpointError(
      'No readable checkpoint in %s: %s. Nothing was changed; copy the '
      'checkpoint files in again from where they came from, or use another '
      'directory.' % (directory, '; '.join(
          '%s: %s' % (os.path.basename(path), reason)
          for path, reason in passed_over)))


def _set_aside(train_dir, paths):
  """Moves files into train_dir/SET_ASIDE_DIR, never over another file.

  Returns:
    The directory they are in now.
  """
  aside = os.path.join(train_dir, SET_ASIDE_DIR)
  tf.io.gfile.makedirs(aside)
  for path in paths:
    target = os.path.join(aside, os.path.basename(path))
    suffix = 1
    while tf.io.gfile.exists(target):
      target = os.path.join(aside, '%s.%d' % (os.path.basename(path), suffix))
      suffix += 1
    tf.io.gfile.rename(path, target)
  return aside


def notes(latest, then, set_aside=None):
  """Words the lines that say what latest_checkpoint() passed over, and why.

  The one wording of these notes, for the trainers, the evaluator and
  cifar10_predict.py.

  Args:
    latest: a Latest.
    then: what the caller does instead, a sentence: 'Evaluating <path>.'
    set_aside: {path: the directory its files were moved to}, for the
      index file (INDEX_FILE) and the checkpoints a trainer set aside.

  Returns:
    A list of lines starting 'Note:'.
  """
  set_aside = set_aside or {}
  lines = []
  if latest.outside:
    lines.append('Note: the index file of %s names checkpoints outside '
                 'it, left out (nothing there is read or deleted): %s.%s' % (
                     latest.directory, ', '.join(latest.outside),
                     ' Moved it to %s/.' % set_aside[INDEX_FILE]
                     if INDEX_FILE in set_aside else ''))
  if INDEX_FILE in set_aside and latest.index_problem:
    lines.append('Note: %s; moved it to %s/ and went by the checkpoint '
                 'files.' % (latest.index_problem, set_aside[INDEX_FILE]))
  elif latest.index_problem and latest.path:
    lines.append('Note: %s; going by the checkpoint files.'
                 % latest.index_problem)
  for path, reason in latest.passed_over:
    moved = (' Its files are moved to %s/.' % set_aside[path]
             if path in set_aside else '')
    lines.append('Note: checkpoint %s is passed over: %s.%s %s'
                 % (path, reason, moved, then))
  return lines


def prepare_resume(train_dir, var_list, report=print):
  """Makes the newest readable checkpoint the one a trainer resumes from.

  The checkpoints newer than it that cannot be read, and an unreadable
  index file, are moved to train_dir/set_aside/ (one line each says which
  and why), so that no save overwrites them; the index file is rewritten
  with paths relative to train_dir when it says anything else, without the
  checkpoints it names outside train_dir (or moved aside when it names
  none inside), so that the saver never deletes those.

  Args:
    train_dir: the trainer's --train_dir.
    var_list: dict of the names in the checkpoint to the model's variables
      (what the session restores).
    report: prints a line.

  Returns:
    The checkpoint's path, or None when train_dir holds none.

  Raises:
    errors.CheckpointError: train_dir holds checkpoints, none of them
      readable, or the newest readable one is not this model's; nothing
      was changed.
  """
  latest = latest_checkpoint(train_dir)
  if latest.path:  # Before anything is moved or written.
    check_checkpoint(latest.path, var_list, advice=(
        'Nothing was changed; give --train_dir a new directory, or one of '
        'this trainer\'s runs'))
  set_aside = {}
  # An index file that cannot be rewritten to name only this directory's
  # checkpoints goes, or the session would restore what it names.
  if latest.index_problem or (latest.outside and latest.path is None):
    set_aside[INDEX_FILE] = _set_aside(
        train_dir, [os.path.join(train_dir, INDEX_FILE)])
  for path, _ in latest.passed_over:
    files = _files_of(path, meta=True)
    if files and (os.path.normpath(os.path.dirname(path)) ==
                  os.path.normpath(train_dir)):
      set_aside[path] = _set_aside(train_dir, files)
  for line in notes(latest, 'Training resumes from %s.' % latest.path,
                    set_aside):
    report(line)
  if latest.path is None:
    return None
  write_index(train_dir, latest.path)
  return latest.path


def write_index(train_dir, path):
  """Makes path the latest checkpoint in the index file, relative paths.

  The older checkpoints it named stay named (oldest first), so that the
  saver goes on keeping its last few and removing older ones. An index
  file that says exactly this already is left as it is.

  Args:
    train_dir: the run directory.
    path: the checkpoint, in train_dir.
  """
  named, _, _ = _read_index_file(train_dir)
  older = [p for p in named if step_of(p) < step_of(path) and _files_of(p)]
  paths = [os.path.relpath(p, train_dir) for p in older + [path]]
  filename = os.path.join(train_dir, INDEX_FILE)
  if tf.io.gfile.exists(filename):
    with tf.io.gfile.GFile(filename) as f:
      if f.read().splitlines() == (
          ['model_checkpoint_path: "%s"' % paths[-1]] +
          ['all_model_checkpoint_paths: "%s"' % p for p in paths]):
        return
  with console.quiet_tf_logging():  # update_checkpoint_state is deprecated.
    # Relative paths under an absolute train_dir are written as they are.
    tf1.train.update_checkpoint_state(
        os.path.abspath(train_dir), paths[-1],
        all_model_checkpoint_paths=paths)


def check_checkpoint(checkpoint_path, var_list, advice=(
    'Point --checkpoint_dir at a --train_dir of this project\'s trainers')):
  """Checks that a checkpoint holds this model's variables.

  Args:
    checkpoint_path: the checkpoint.
    var_list: dict of the names in the checkpoint to restore from to the
      model's variables.
    advice: what to do, the error line's last sentence.

  Returns:
    The global step the checkpoint was saved at.

  Raises:
    errors.CheckpointError: a variable is missing, or has another shape.
    tf.errors.NotFoundError: the checkpoint is gone.
  """
  reader = tf.train.load_checkpoint(checkpoint_path)
  shapes = reader.get_variable_to_shape_map()
  for name, var in sorted(var_list.items()):
    if shapes.get(name) != var.shape.as_list():
      raise errors.CheckpointError(
          'Checkpoint %s is not this model\'s: %s. %s.'
          % (checkpoint_path,
             'it has no %s' % name if name not in shapes else
             '%s is %s there, %s here' % (name, shapes[name],
                                           var.shape.as_list()), advice))
  return int(reader.get_tensor(tf1.GraphKeys.GLOBAL_STEP))


def checkpoint_step(checkpoint_path):
  """Returns the global step a checkpoint was saved at; 0 for None."""
  if checkpoint_path is None:
    return 0
  return int(tf.train.load_checkpoint(checkpoint_path).get_tensor(
      tf1.GraphKeys.GLOBAL_STEP))


def rewind_to_finite(train_dir):
  """Makes the newest checkpoint whose values are all finite the latest.

  The step before a NaN loss may already have written non-finite weights,
  and a checkpoint may have been saved from them. Those checkpoints stay on
  disk; a rerun passes over them (prepare_resume).

  Returns:
    The path of that checkpoint, or None if there is none.
  """
  try:
    latest = latest_checkpoint(train_dir).path
  except errors.CheckpointError:
    return None
  if latest:
    write_index(train_dir, latest)
  return latest


def add_saver():
  """Adds the saver that the training session takes for its checkpoints.

  The session's default saver, except that the index file records paths
  relative to --train_dir, so that the directory can be moved.
  """
  if not tf1.get_collection(tf1.GraphKeys.SAVERS):
    tf1.add_to_collection(tf1.GraphKeys.SAVERS, tf1.train.Saver(
        sharded=True, max_to_keep=5, keep_checkpoint_every_n_hours=10000.0,
        allow_empty=True, save_relative_paths=True))


class CheckpointSaverHook(tf1.train.CheckpointSaverHook):
  """Saves checkpoints as TensorFlow's saver hook does, except that it does
  not save again the checkpoint training resumes from (it would at the
  start), so the files a user has stay exactly as they were, and that a
  run resumed between two multiples of save_steps saves at the next
  multiple (TensorFlow's would save save_steps after the resumed step), so
  that it saves at the steps the unstopped run did."""

  def __init__(self, resumed_step, *args, **kwargs):
    """Makes the hook.

    Args:
      resumed_step: the step of the checkpoint resumed from, or None.
      *args: tf.compat.v1.train.CheckpointSaverHook's arguments.
      **kwargs: its keyword arguments, save_steps among them.
    """
    super(CheckpointSaverHook, self).__init__(*args, **kwargs)
    self._resumed_step = resumed_step
    self._save_steps = kwargs.get('save_steps')

  def after_create_session(self, session, coord):
    """As TensorFlow's hook at the start; then counts the steps to the next
    save from the last multiple of save_steps, not from the resumed step."""
    super(CheckpointSaverHook, self).after_create_session(session, coord)
    if self._save_steps:
      step = self._timer.last_triggered_step()  # The step it started at.
      self._timer.update_last_triggered_step(step - step % self._save_steps)

  def _save(self, session, step):
    if step == self._resumed_step:
      self._resumed_step = None
      return False  # Do not stop.
    return super(CheckpointSaverHook, self)._save(session, step)
