"""Plots precision @ 1 against the training step, from the evaluator's logs.

Each curve is LABEL=PATH: PATH is an --eval_dir of cifar10_eval.py (its
event files' 'Precision @ 1' values, at the global step of each evaluated
checkpoint) or a CSV file of `step,precision` lines. The tutorial's
published points are marked. Prints every curve's value at each
thousandth step, and writes the PNG.

Usage (matplotlib comes with requirements-dev.txt), the picture in README:
  python docs/plot_precision.py --out=docs/precision.png \\
      'float32, one tower of 128 (100K run)=docs/precision_float32_100k.csv' \\
      'bfloat16, two towers of 128 (30K run)=docs/precision_bf16_30k.csv' \\
      'float32, two towers of 128 (30K run)=docs/precision_float32_30k.csv'
"""

import argparse
import csv
import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import matplotlib  # pylint: disable=g-import-not-at-top
matplotlib.use('Agg')
import matplotlib.ticker  # pylint: disable=g-import-not-at-top
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

tf.get_logger().setLevel('ERROR')  # TF2's notes on the TF1 event reader.

import event_files  # pylint: disable=g-import-not-at-top

TAG = event_files.PRECISION_TAG
# The tutorial's published results: (step, precision, what).
TUTORIAL = [(30000, 0.84, 'tutorial, 2-4 GPUs: ~84% at 30K steps'),
            (100000, 0.86, 'tutorial, 1 GPU: ~86% at 100K steps')]


def read_curve(path):
  """Reads (step, precision) points, sorted by step, the last value kept.

  Args:
    path: an eval directory of event files, or a CSV file.

  Returns:
    A list of (step, precision).
  """
  if os.path.isdir(path):
    return sorted((step, values[TAG]) for step, values in
                  event_files.scalars(path, {TAG}).items())
  points = {}
  with open(path) as f:
    for row in csv.reader(f):
      if row and not row[0].startswith('#'):
        points[int(row[0])] = float(row[1])
  return sorted(points.items())


def print_table(curves):
  """Prints every curve's precision at each step that is a multiple of 1000."""
  steps = sorted({step for points in curves.values() for step, _ in points
                  if step and step % 1000 == 0})
  print('| step | ' + ' | '.join(curves) + ' |')
  print('| ---: |' + ' ---: |' * len(curves))
  for step in steps:
    cells = []
    for points in curves.values():
      value = dict(points).get(step)
      cells.append('%.1f%%' % (100 * value) if value is not None else '')
    print('| %d | %s |' % (step, ' | '.join(cells)))


def plot(curves, out):
  """Writes the curves and the tutorial's points as a PNG."""
  fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
  for label, points in curves.items():
    ax.plot([s for s, _ in points], [100 * p for _, p in points],
            marker='.', label=label)
  last = max(step for points in curves.values() for step, _ in points)
  for step, precision, what in TUTORIAL:
    if step <= last:
      ax.plot([step], [100 * precision], 'k*', markersize=12, label=what)
    else:
      ax.axhline(100 * precision, color='k', linestyle=':', label=what)
  ax.xaxis.set_major_formatter(
      matplotlib.ticker.FuncFormatter(lambda step, _: '%gK' % (step / 1000)))
  ax.set_xlabel('global step')
  ax.set_ylabel('precision @ 1 on the 10,000 test images (%)')
  ax.set_ylim(50, 90)
  ax.grid(True, alpha=0.3)
  ax.legend(loc='lower right')
  fig.tight_layout()
  fig.savefig(out)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('curves', nargs='+', metavar='LABEL=PATH')
  parser.add_argument('--out', required=True, help='the PNG to write')
  args = parser.parse_args()
  curves = {}
  for spec in args.curves:
    label, sep, path = spec.partition('=')
    if not sep or not os.path.exists(path):
      parser.error('%s: give LABEL=PATH, PATH an eval directory or a CSV '
                   'file' % spec)
    curves[label] = read_curve(path)
    if not curves[label]:
      parser.error('%s: no %r values there' % (path, TAG))
  print_table(curves)
  plot(curves, args.out)
  print('Wrote %s.' % args.out)


if __name__ == '__main__':
  main()
