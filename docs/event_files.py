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
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  found = collections.defaultdict(dict)
  for path in sorted(glob.glob(os.path.join(directory,
                                            'events.out.tfevents.*'))):
    try:
      for event in tf.compat.v1.train.summary_iterator(path):
        for value in event.summary.value:
          if value.tag in tags:
            found[event.step][value.tag] = value.simple_value
    except tf.errors.DataLossError:
      pass  # A run is writing the last record: read up to it.
  return found


def start_times(directory):
  """Returns the sorted wall times (seconds since the epoch) at which each
  event file in directory was begun: its first record's. A trainer begins
  one each time it starts, so they are the starts of a resumed run's parts."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  starts = []
  for path in glob.glob(os.path.join(directory, 'events.out.tfevents.*')):
    try:
      for event in tf.compat.v1.train.summary_iterator(path):
        starts.append(event.wall_time)
        break
    except tf.errors.DataLossError:
      pass  # Its first record torn (a trainer killed as it began it).
  return sorted(starts)
