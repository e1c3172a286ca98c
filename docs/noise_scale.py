"""The gradient noise scale over training, as the towers measured it.

Reads the 'gradient_noise_scale' summaries (B_simple, in examples:
machinery/noise_scale.py) from the event files of multi-GPU runs, one
--run per number of towers (TOWERS=TRAIN_DIR), and draws B_simple
against epochs, each run's batch (towers x 128) a horizontal line of its
color beside it, and the critical batch fitted to the measured steps to
80% (--b_crit, docs/recipes.py) a dashed one. Prints B_simple at
--epochs, each the median of the summaries within an epoch (eight towers
summarize every 2 epochs).

Usage (matplotlib comes with requirements-dev.txt):
  python docs/noise_scale.py --run=2=R2/train --run=4=R4/train \\
      --run=8=R8/train --b_crit=245 --out=docs/noise_scale.png
"""

import argparse

import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np

import event_files  # pylint: disable=g-import-not-at-top

TAG = 'gradient_noise_scale'
BATCH = 128
EXAMPLES_PER_EPOCH = 50000
COLORS = {2: 'tab:blue', 4: 'tab:orange', 8: 'tab:green'}
FIRST_EPOCH = 1.0  # The picture starts here (the averages fill before).


def read_run(train_dir, towers):
  """Returns [(epochs, B_simple, tr(Sigma), |G|^2)] of a run, in order."""
  found = event_files.scalars(train_dir, {TAG, TAG + '/trace_sigma',
                                          TAG + '/gradient_squared'})
  return [(step * BATCH * towers / EXAMPLES_PER_EPOCH, values[TAG],
           values.get(TAG + '/trace_sigma'),
           values.get(TAG + '/gradient_squared'))
          for step, values in sorted(found.items()) if TAG in values]


def at_epoch(points, epoch):
  """Returns the median of a run's values within an epoch of epoch
  (B_simple, tr(Sigma), |G|^2), or None where it has none."""
  near = [p for p in points if abs(p[0] - epoch) <= 1.0]
  if not near:
    return None
  return tuple(float(np.median([p[i] for p in near])) for i in (1, 2, 3))


def print_table(runs, epochs):
  """Prints B_simple (and its parts) at each of epochs, a row per run."""
  print('| towers (batch) | %s |' % ' | '.join(
      '%g epochs' % e for e in epochs))
  print('| --- |%s' % (' ---: |' * len(epochs)))
  for towers, points in sorted(runs.items()):
    cells = []
    for epoch in epochs:
      value = at_epoch(points, epoch)
      cells.append('-' if value is None else '%.0f (%.1f / %.3f)' % value)
    print('| %d (%d) | %s |' % (towers, BATCH * towers, ' | '.join(cells)))


def plot(runs, b_crit, out):
  """Draws B_simple against epochs, the batches as lines."""
  fig, axes = plt.subplots(figsize=(7.5, 4.6))
  for towers, points in sorted(runs.items()):
    color = COLORS.get(towers)
    # The first epoch's values are the moving averages' start, not yet
    # averages: left out.
    points = [p for p in points if p[0] >= FIRST_EPOCH]
    axes.plot([p[0] for p in points], [p[1] for p in points], color=color,
              lw=1, label='B_simple, %d towers' % towers)
    axes.axhline(BATCH * towers, color=color, lw=1, ls=':',
                 label='batch of %d towers: %d' % (towers, BATCH * towers))
  for (value, label), style in zip(b_crit, ('--', '-.', ':')):
    axes.axhline(value, color='black', lw=1, ls=style, label=label)
  axes.set_yscale('log')
  axes.set_xlabel('epochs')
  axes.set_ylabel('examples')
  axes.grid(alpha=0.3)
  axes.legend(fontsize=7, ncol=2)
  axes.set_title('The gradient noise scale the towers measure, and the '
                 'batches', fontsize=10)
  fig.tight_layout()
  fig.savefig(out, dpi=110)


def main():
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--run', action='append', required=True,
                 help='TOWERS=TRAIN_DIR')
  p.add_argument('--b_crit', action='append', default=[],
                 help='VALUE=LABEL: a critical batch to draw')
  p.add_argument('--epochs', default='1,2,5,10,20,30,36')
  p.add_argument('--out', default=None)
  args = p.parse_args()
  runs = {}
  for spec in args.run:
    towers, train_dir = spec.split('=', 1)
    runs[int(towers)] = read_run(train_dir, int(towers))
  print_table(runs, [float(e) for e in args.epochs.split(',')])
  if args.out:
    plot(runs, [(float(v), label) for v, label in (
        spec.split('=', 1) for spec in args.b_crit)], args.out)


if __name__ == '__main__':
  main()
