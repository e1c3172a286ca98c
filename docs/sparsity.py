"""Prints a run's learning rate and its ReLUs' sparsity, step by step.

The tutorial's trainers summarize, every 100 steps, the learning rate and
each layer's sparsity: the fraction of its ReLU outputs that are zero
(TensorBoard's 'conv2/sparsity'). A layer whose sparsity nears 1 has
stopped passing anything on. docs/scaling.md reads eight towers' failure
at the linear rule's rate from this table:

    python docs/sparsity.py --train_dir=R/train --every=200

A run with --optimizer=lars also summarizes each layer's trust ratio
(machinery/lars.py: the factor LARS multiplies the global rate by for
that layer's weights, 'trust_ratio/conv2/weights'); the table then gains
a column of each layer's ratio.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import argparse
import glob
import os
import sys

import event_files

LAYERS = ('conv1', 'conv2', 'local3', 'local4')
# LARS scales these layers' weights, and summarizes their trust ratios.
SCALED = LAYERS + ('softmax_linear',)


def parse_args(argv):
  """Returns the command line's arguments."""
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--train_dir', required=True,
                 help='a trainer\'s --train_dir (its event files)')
  p.add_argument('--every', type=int, default=100,
                 help='print a row every this many steps')
  p.add_argument('--last_step', type=int, default=None,
                 help='print no row after this step')
  return p.parse_args(argv)


def read_summaries(train_dir):
  """Returns {step: {tag: value}} of the learning rate, the layers'
  sparsity and LARS's trust ratios in train_dir's event files."""
  if not glob.glob(os.path.join(train_dir, 'events.out.tfevents.*')):
    sys.exit('Error: no event files in --train_dir=%s: give the directory '
             'a trainer wrote.' % train_dir)
  return event_files.scalars(
      train_dir, {'learning_rate'} | {layer + '/sparsity' for layer in LAYERS}
      | {_ratio_tag(layer) for layer in SCALED})


def _ratio_tag(layer):
  """Returns the tag of the trust ratio of layer's weights."""
  return 'trust_ratio/%s/weights' % layer


def table(found, every, last_step=None):
  """Returns the Markdown table's lines: a row per `every` steps, and the
  trust ratios' columns where the run has them."""
  ratios = [layer for layer in SCALED
            if any(_ratio_tag(layer) in values for values in found.values())]
  tags = ([layer + '/sparsity' for layer in LAYERS] +
          [_ratio_tag(layer) for layer in ratios])
  lines = ['| step | learning rate | %s |' % ' | '.join(
      list(LAYERS) + ['%s ratio' % layer for layer in ratios]),
           '| ---: | ---: |' + ' ---: |' * len(tags)]
  next_row = 0
  for step in sorted(found):
    if step < next_row or (last_step is not None and step > last_step):
      continue
    next_row = (step // every + 1) * every
    values = found[step]
    lines.append('| %d | %s | %s |' % (
        step, _value(values, 'learning_rate'),
        ' | '.join(_value(values, tag) for tag in tags)))
  return lines


def _value(values, tag):
  """Returns values[tag] to 3 digits, or '-' where the step has none."""
  return '%.3f' % values[tag] if tag in values else '-'


def main(argv):
  args = parse_args(argv)
  print('\n'.join(table(read_summaries(args.train_dir), args.every,
                        args.last_step)))


if __name__ == '__main__':
  main(sys.argv[1:])
