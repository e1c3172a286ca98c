"""Reads scalar summaries from a directory of TensorBoard event files.

The docs' scripts read runs while they are still being written: a
trainer's or evaluator's last record may be half written, so each file is
read up to it.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import collections
import glob
import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
# cifar10_eval.py's summary of precision @ 1, which the docs' scripts read
# from an --eval_dir.
from machinery.summaries import PRECISION_TAG  # pylint: disable=g-import-not-at-top,wrong-import-position,unused-import


def scalars(directory, tags):
  """Returns {step: {tag: value}} of the scalar summaries tagged one of
  tags in directory's event files ({} where there are none)."""
  found = collections.defaultdict(dict)
  for path in _paths(directory):
    for event in _events(path):
      for value in event.summary.value:
        if value.tag in tags:
          found[event.step][value.tag] = value.simple_value
  return found


def start_times(directory):
  """Returns the sorted wall times (seconds since the epoch) at which each
  event file in directory was begun: its first record's. A trainer begins
  one each time it starts, so they are the starts of a resumed run's parts.
  A file whose first record is torn (a trainer killed as it began it)
  gives none."""
  return sorted(event.wall_time for path in _paths(directory)
                for event in itertools.islice(_events(path), 1))


def _paths(directory):
  """Returns the paths of directory's event files, sorted."""
  return sorted(glob.glob(os.path.join(directory, 'events.out.tfevents.*')))


def _events(path):
  """Yields the event file's records up to its last whole one: a run may
  be writing the last."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  try:
    for event in tf.compat.v1.train.summary_iterator(path):
      yield event
  except tf.errors.DataLossError:
    return  # A record half written: read up to it.
