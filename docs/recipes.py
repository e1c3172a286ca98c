"""Recipes to a target: the runs of each, their steps, and what a step buys.

Reads docs/time_to_target.py's evaluations of the recipes' runs (their
curve.csv lines put together, with the `recipe` column: the trainer's
flags) and prints, per number of towers and recipe, the steps, examples
and epochs to --target (80% unless given; min..max over the seeds) and
each run's best precision within its budget. With --targets, it prints the
steps to each of several targets instead, the best precision and the
precision at the end of the budget, and S(B) fitted at each; with
--out too, it draws them, and B_crit against the target beside the noise
scale given by --b_simple; --recipe_contains keeps one family of
recipes (the runs whose recipe holds its text). It fits the empirical
model of large-batch training (McCandlish et al. 2018), steps to the
target

  S(B) = S_min (1 + B_crit / B)

for a batch of B examples (towers x 128), to the tutorial's SGD (from
docs/time_to_80.csv: each number of towers at its fewest steps) and to the
recipes (each number of towers at its best recipe), draws both against
the batch into --out, and prints the minutes to the target that the
step-cost model of docs/plot_scaling.py predicts for N GPUs with the
recipes' steps. With --answer, it draws docs/scaling.md's first picture
instead: the steps to 80% and 83% per number of towers and their
predicted minutes on N GPUs. With --ceiling, it draws the ceiling's runs
(docs/ceiling_256.csv) against epochs beside the tutorial's long SGD.

Usage (matplotlib comes with requirements-dev.txt):
  python docs/recipes.py --collect ~/long/r*_s*/curve.csv \\
      --curves=docs/recipes_to_80.csv          # put the runs together
  python docs/recipes.py --curves=docs/recipes_to_80.csv \\
      --sgd=docs/time_to_80.csv --cpu_sgd=docs/time_to_80_cpu.csv \\
      --out=docs/recipes_to_80.png
  python docs/recipes.py --curves=docs/recipes_to_83.csv --target=0.83
  python docs/recipes.py --curves=docs/recipes_to_80.csv \\
      --curves=docs/recipes_to_83.csv --targets=0.78,0.8,0.82,0.83
  python docs/recipes.py --curves=docs/recipes_held_out_float32.csv \\
      --targets=0.78,0.8,0.82,0.83 --b_simple=0.83=1092 ... \\
      '--recipe_contains=--conv_weight_decay=0.0005 --fc_weight_decay=0.0005' \\
      --out=docs/batch_near_the_top.png
  python docs/recipes.py --curves=docs/recipes_to_80.csv \\
      --curves=docs/recipes_to_83.csv --sgd=docs/time_to_80.csv \\
      --cpu_sgd=docs/time_to_80_cpu.csv \\
      --sgd_long=docs/precision_float32_100k.csv --answer=docs/answer.png
  python docs/recipes.py --curves=docs/ceiling_256.csv \\
      --sgd_long=docs/precision_float32_100k.csv --ceiling=docs/ceiling.png
"""

import argparse
import collections
import csv
import itertools
import math
import sys

import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import matplotlib.ticker  # pylint: disable=g-import-not-at-top

import plot_scaling  # pylint: disable=g-import-not-at-top
import time_to_target  # pylint: disable=g-import-not-at-top

BATCH = time_to_target.BATCH_SIZE  # one tower's examples a step
TARGET = 0.80
ANSWER_TARGETS = (0.80, 0.83)  # The answer's columns.
CEILING_GOAL = 0.85  # #66's goal for one tower within 256 epochs.
# The ceiling picture: a colour per recipe, a line style per seed.
CEILING_COLORS = ('tab:blue', 'tab:cyan', 'tab:red', 'tab:orange', 'tab:green',
                  'tab:purple', 'tab:brown', 'tab:olive')
SEED_STYLES = ('-', '--')
# The batches an S(B) curve is drawn over: one tower's 128 to eight towers' 1,024.
FIT_LINE = [BATCH * 2 ** (i / 20.0) for i in range(61)]
# The batches of one, two, four and eight towers: the pictures' ticks.
TOWER_BATCHES = [BATCH * n for n in (1, 2, 4, 8)]
FIELDS = ['towers', 'rate', 'warmup_epochs', 'seed', 'step', 'examples',
          'epochs', 'precision', 'wall_s', 'recipe']


def collect(paths, out):
  """Puts the curve.csv files of runs together into one CSV at out."""
  rows = []
  for path in paths:
    with open(path) as f:
      rows += list(csv.DictReader(f))
  for row in rows:  # The runs before the CSV took them from the recipe.
    row['rate'], row['warmup_epochs'] = time_to_target.rate_and_warmup(
        row['recipe'], None, row['rate'], row['warmup_epochs'])
  rows.sort(key=lambda r: (int(r['towers']), r['recipe'], int(r['seed']),
                           int(r['step'])))
  with open(out, 'w') as f:
    writer = csv.DictWriter(f, FIELDS, extrasaction='ignore')
    writer.writeheader()
    writer.writerows(rows)


def label(recipe, towers):
  """Returns a recipe's short name: its optimizer (and --momentum, where
  given), schedule, budget, warm-up (where given), peak rate (after the
  scaling for towers) and regularization (where given), as 'LARS 0.3,
  cosine 50 ep, warm-up 2, peak 0.04, smoothing 0.1'."""
  given = time_to_target.recipe_flags(recipe)
  if not given:
    return "the tutorial's SGD"
  optimizer = given.get('optimizer', 'sgd')
  name = {'lars': 'LARS %s' % given.get('lars_trust_coefficient', '0.001'),
          'momentum': 'momentum', 'sgd': 'SGD'}[optimizer]
  if 'momentum' in given:  # Named where given (the default: 0.9).
    if optimizer == 'momentum':
      name += ' %s' % given['momentum']
    else:
      name += ', momentum %s' % given['momentum']
  if '--nesterov' in recipe.split():
    name += ' (Nesterov)'
  peak = float(given.get('initial_learning_rate', 0.1))
  if given.get('learning_rate_scaling') == 'linear':
    peak *= towers
  warmup = given.get('warmup_epochs')
  regularized = ''.join(', %s %s' % (words, given[flag]) for flag, words in (
      ('label_smoothing', 'smoothing'), ('conv_weight_decay', 'conv decay'),
      ('dropout', 'dropout'), ('cutout', 'cutout'), ('mixup', 'mixup'),
      ('moving_average_decay', 'averages'))
                        if flag in given and float(given[flag]))
  if 'fc_weight_decay' in given:  # The tutorial's is 0.004: 0 is news too.
    regularized += ', fc decay %s' % given['fc_weight_decay']
  return '%s, %s %s ep, %speak %g%s' % (
      name, given.get('lr_schedule', 'tutorial'), given.get('train_epochs', '-'),
      'warm-up %s, ' % warmup if warmup and float(warmup) else '', peak,
      regularized)


def read_recipes(path):
  """Returns {(towers, recipe): {seed: [(step, examples, epochs,
  precision)], in step order}} from a CSV of collect()'s."""
  runs = collections.defaultdict(lambda: collections.defaultdict(list))
  with open(path) as f:
    for row in csv.DictReader(f):
      runs[int(row['towers']), row['recipe']][int(row['seed'])].append((
          int(row['step']), int(row['examples']), float(row['epochs']),
          float(row['precision'])))
  for seeds in runs.values():
    for points in seeds.values():
      points.sort()
  return runs


def fit(points):
  """Fits S(B) = S_min (1 + B_crit / B) to (batch, steps) points by least
  squares in 1 / B; returns (S_min, B_crit)."""
  xs = [1.0 / b for b, _ in points]
  ys = [s for _, s in points]
  n = len(points)
  mean_x, mean_y = sum(xs) / n, sum(ys) / n
  slope = (sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) /
           sum((x - mean_x) ** 2 for x in xs))
  s_min = mean_y - slope * mean_x
  return s_min, slope / s_min


def fitted_steps(s_min, b_crit):
  """Returns S(B) = S_min (1 + B_crit / B) at each batch of FIT_LINE: the
  fitted curve a picture draws."""
  return [s_min * (1 + b_crit / b) for b in FIT_LINE]


def seed_crossings(seeds, target=TARGET):
  """Returns each seed's (step, examples, epochs) at its first evaluation
  at target or more, or None where it never got there, in seeds' order."""
  return [plot_scaling.crossing([p + (None,) for p in points], target)
          for points in seeds.values()]


def mean_steps(seeds, target=TARGET):
  """Returns the mean steps to target over seeds, or None unless every
  seed reached it."""
  hits = seed_crossings(seeds, target)
  if not hits or not all(hits):
    return None
  return sum(hit[0] for hit in hits) / len(hits)


def best_steps(runs, target=TARGET):
  """Returns {towers: (mean steps to target, its configuration)}, the
  fewest of each number of towers over the recipes of runs (not the
  tutorial's SGD, whose recipe is empty). A recipe with more seeds wins
  over one with fewer, so one lucky seed does not beat a two-seed mean."""
  ranked = {}
  for (towers, config), seeds in runs.items():
    if not config:  # The tutorial's SGD, timed beside the recipes.
      continue
    steps = mean_steps(seeds, target)
    rank = (-len(seeds), steps)
    if steps is not None and (towers not in ranked
                              or rank < ranked[towers][0]):
      ranked[towers] = (rank, config)
  return {towers: (rank[1], config)
          for towers, (rank, config) in ranked.items()}


def print_recipes(runs, target=TARGET):
  """Prints a row per (towers, recipe): its seeds' steps, examples and
  epochs to target (min..max; the steps say how many seeds reached it when
  not all did), and each run's best precision."""
  print('| towers | recipe | seeds | steps to %.0f%% | examples (millions) '
        '| epochs | best precision (at epoch) |' % (100 * target))
  print('| ---: | --- | ---: | --- | --- | --- | --- |')
  for (towers, recipe), seeds in sorted(runs.items()):
    hits = [hit for hit in seed_crossings(seeds, target) if hit]
    def spread(i, scale=1, fmt='%d'):
      if not hits:
        return '-'
      low, high = (fmt % (f(hit[i] for hit in hits) / scale)
                   for f in (min, max))
      return low if low == high else low + '..' + high
    steps = spread(0)
    if hits and len(hits) < len(seeds):
      steps += ' (%d of %d seeds)' % (len(hits), len(seeds))
    bests = '; '.join('seed %d %.1f%% (%.1f)' % (
        (seed,) + max((100 * p[3], p[2]) for p in points))
                      for seed, points in sorted(seeds.items()))
    print('| %d | %s | %d | %s | %s | %s | %s |' % (
        towers, label(recipe, towers), len(seeds), steps, spread(1, 1e6, '%.2f'),
        spread(2, 1, '%.1f'), bests))


def sgd_steps(sgd_path, cpu_path, target=TARGET):
  """Returns {towers: mean steps to target} of the tutorial's SGD: each
  number of towers at its fewest (docs/time_to_80.csv, and
  cifar10_train.py's one tower from docs/time_to_80_cpu.csv)."""
  curves = plot_scaling.read_curves(sgd_path)
  curves.update(plot_scaling.read_curves(cpu_path))
  best = {}
  for (towers, _, _), seeds in curves.items():
    hits = [plot_scaling.crossing(p, target) for p in seeds.values()]
    if hits and all(hits):
      steps = sum(hit[0] for hit in hits) / len(hits)
      best[towers] = min(best.get(towers, steps), steps)
  return best


def plot(sgd, recipe, out, target=TARGET):
  """Draws steps to target against the batch, each set of points with
  its fitted S(B); returns the fits {name: (S_min, B_crit)}."""
  fits = {}
  fig, axes = plt.subplots(figsize=(7.5, 4.8))
  for name, steps, color in (("the tutorial's SGD", sgd, 'tab:blue'),
                             ('the recipes', recipe, 'tab:red')):
    points = sorted((BATCH * towers, s) for towers, s in steps.items())
    s_min, b_crit = fits[name] = fit(points)
    axes.plot([b for b, _ in points], [s for _, s in points], 'o',
              color=color)
    axes.plot(FIT_LINE, fitted_steps(s_min, b_crit), '-',
              color=color, label='%s: S_min %.0f steps, B_crit %.0f '
              'examples' % (name, s_min, b_crit))
  for steps, text, color, height in (
      (sgd, 'SGD: not in\n100 epochs', 'tab:blue', 0.97),
      (recipe, 'recipes: not every\nseed reached %.0f%%' % (100 * target),
       'tab:red', 0.80)):
    missing = [b for b in TOWER_BATCHES if b // BATCH not in steps]
    for b in missing:
      axes.annotate(text, (b, height), xycoords=('data', 'axes fraction'),
                    ha='right' if b == TOWER_BATCHES[-1] else 'center',
                    va='top', color=color, fontsize=8)
  axes.set_xscale('log', base=2)
  axes.set_xticks(TOWER_BATCHES)
  axes.set_xticklabels(['%d\n(%d tower%s)' % (b, b // BATCH, 's' * (
      b > BATCH)) for b in TOWER_BATCHES])
  axes.set_xlabel('examples a step (towers x 128)')
  axes.set_ylabel('steps to %.0f%% precision @ 1' % (100 * target))
  axes.set_ylim(0, None)
  axes.grid(alpha=0.3)
  axes.legend(fontsize=8)
  axes.set_title('Steps to %.0f%%: S(B) = S_min (1 + B_crit / B), fitted'
                 % (100 * target), fontsize=10)
  fig.tight_layout()
  fig.savefig(out, dpi=110)
  return fits


def reached_steps(runs, target=TARGET):
  """Returns {towers: (steps of each seed that reached target, seeds
  run)} for each number of towers' recipe that reached it: the recipes
  every seed (and two or more) took there first, then by fewest mean
  steps (the tutorial's SGD, whose recipe is empty, left out)."""
  best = {}
  for (towers, config), seeds in runs.items():
    if not config:
      continue
    hits = [hit[0] for hit in seed_crossings(seeds, target) if hit]
    if not hits:
      continue
    rank = (len(hits) < len(seeds), len(seeds) < 2, sum(hits) / len(hits))
    if towers not in best or rank < best[towers][0]:
      best[towers] = (rank, (sorted(hits), len(seeds)))
  return {towers: found for towers, (_, found) in best.items()}


def seeds_note(reached, seeds):
  """Returns None where every seed of two or more reached a target, else
  what the picture says beside its hollow point."""
  if seeds < 2:
    return 'one seed so far'
  return None if reached == seeds else '%d of %d seeds' % (reached, seeds)


def read_steps(path):
  """Returns [(step, precision)] of a step,precision CSV (# comments
  allowed, docs/precision_float32_100k.csv)."""
  with open(path) as f:
    rows = [line.split(',') for line in f
            if line.strip() and not line.startswith('#')]
  return [(int(s), float(p)) for s, p in rows]


def first_step_at(path, target):
  """Returns the first step of a step,precision CSV at target or more, or
  None."""
  return next((s for s, p in read_steps(path) if p >= target), None)


def log_y(axes):
  """Puts axes' y on a log scale ticked at 1, 2 and 5 times the powers of
  ten, written out in full (2,000, not 2 x 10^3)."""
  axes.set_yscale('log')
  axes.yaxis.set_major_locator(matplotlib.ticker.LogLocator(
      subs=(1.0, 2.0, 5.0)))
  axes.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(
      lambda y, _: '{:,g}'.format(y)))
  axes.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def plot_answer(runs, sgd, out, targets=ANSWER_TARGETS):
  """Draws the answer: the recipes' steps to each target against the
  number of towers (min..max over the seeds that reached it, hollow where
  not every seed did), the tutorial's one-tower SGD as a line per target,
  and the minutes those steps take on N GPUs (predicted, 3 ms towers,
  PCIe); returns {target: reached_steps(runs, target)}."""
  fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.3))
  towers_all = (1, 2, 4, 8)
  def minutes(steps, towers):  # Predicted: 3 ms towers, PCIe.
    return plot_scaling.predicted_minutes(
        steps * BATCH * towers, towers, plot_scaling.TOWER_MS[0],
        plot_scaling.PCIE_GB_S, False)
  found = {}
  for target, color in zip(targets, ('tab:blue', 'tab:red')):
    found[target] = reached = reached_steps(runs, target)
    name = '%.0f%%' % (100 * target)
    means = {towers: sum(hits) / len(hits)
             for towers, (hits, _) in reached.items()}
    for towers, (hits, seeds) in sorted(reached.items()):
      mean = means[towers]
      note = seeds_note(len(hits), seeds)
      every = note is None
      left.errorbar([towers], [mean], yerr=[[mean - hits[0]],
                                            [hits[-1] - mean]],
                    fmt='o', color=color, capsize=3,
                    mfc=color if every else 'white')
      if not every:
        left.annotate(note, (towers, mean), textcoords='offset points',
                      xytext=(8, -3), fontsize=8, color=color)
      right.plot([towers], [minutes(mean, towers)], 'o', color=color,
                 mfc=color if every else 'white')
    left.plot([], [], 'o-', color=color, label='the recipes, to %s' % name)
    for t in towers_all:  # A line joins neighbours only: no guessed ones.
      if t in reached and 2 * t in reached:
        left.plot([t, 2 * t], [means[t], means[2 * t]], '-', color=color)
      if t not in reached:
        left.annotate('%s: not yet' % name, (t, 0.02 + 0.06 * (
            target == targets[-1])), xycoords=('data', 'axes fraction'),
                      ha='center', fontsize=8, color=color)
    if target in sgd:
      left.axhline(sgd[target], ls=':', color=color, label="the tutorial's "
                   'SGD, one tower, to %s: {:,}'.format(int(round(sgd[target]))) % name)
      right.axhline(minutes(sgd[target], 1), ls=':', color=color,
                    label="the tutorial's SGD, one GPU, to %s" % name)
    right.plot([], [], 'o', color=color, label='the recipes, to %s' % name)
  for axes in (left, right):
    axes.set_xscale('log', base=2)
    axes.set_xticks(towers_all)
    axes.set_xticklabels([str(t) for t in towers_all])
    log_y(axes)
    axes.grid(alpha=0.3, which='both')
    axes.legend(fontsize=7)
  left.set_xlabel('towers of 128 (measured: virtual devices on CPUs)')
  left.set_ylabel('steps to the target (precision @ 1)')
  left.set_title('Steps to 80% and 83%', fontsize=10)
  right.set_xlabel('GPUs')
  right.set_ylabel('minutes (predicted: 3 ms towers, PCIe)')
  right.set_title('Minutes on N GPUs, predicted', fontsize=10)
  fig.tight_layout()
  fig.savefig(out, dpi=110)
  return found


def sgd_curve(path):
  """Returns [(epochs, precision)] of the tutorial's one-tower SGD (batch
  128) from a step,precision CSV."""
  return [(s * BATCH / time_to_target.EXAMPLES_PER_EPOCH, p)
          for s, p in read_steps(path)]


def run_name(towers, seed):
  """Returns a run's name, as '1 tower, seed 2' or '8 towers, seed 1'."""
  return '%d tower%s, seed %d' % (towers, 's' if towers > 1 else '', seed)


def plot_ceiling(runs, sgd_long, out):
  """Draws each run's precision @ 1 against epochs (a line per tower
  count and seed, its recipe's label), the tutorial's SGD with the same
  examples, and #66's goal; returns {(towers, seed, recipe's label):
  (epochs, precision)} at each run's end."""
  fig, axes = plt.subplots(figsize=(8, 6.5))
  ends = {}
  # A colour per recipe, a line style per seed.
  for color, ((towers, recipe), seeds) in zip(
      itertools.cycle(CEILING_COLORS), sorted(runs.items())):
    for seed, points in sorted(seeds.items()):
      epochs = [e for _, _, e, _ in points]
      precision = [p for _, _, _, p in points]
      name = label(recipe, towers)
      ends[towers, seed, name] = epochs[-1], precision[-1]
      axes.plot(epochs, precision, lw=1, color=color,
                ls=SEED_STYLES[(seed - 1) % len(SEED_STYLES)],
                label='%s: %s' % (run_name(towers, seed), name))
  if sgd_long:
    epochs, precision = zip(*sgd_curve(sgd_long))
    axes.plot(epochs, precision, 'k:', lw=1,
              label="the tutorial's SGD, one tower (float32)")
  axes.axhline(CEILING_GOAL, color='grey', ls='-.', lw=0.8,
               label="#66's goal, %.0f%%" % (100 * CEILING_GOAL))
  axes.set_ylim(0.72, 0.86)
  axes.set_xlabel('epochs (the examples of the tutorial\'s 100,000 steps: 256)')
  axes.set_ylabel('precision @ 1, the test set (moving averages)')
  axes.set_title('The ceiling: 256 epochs', fontsize=10)
  axes.grid(alpha=0.3)
  # Below the axes, where it hides no curve.
  axes.legend(fontsize=7, loc='upper center', bbox_to_anchor=(0.5, -0.12))
  fig.tight_layout()
  fig.savefig(out, dpi=110)
  return ends


def print_minutes(recipes, sgd, target=TARGET):
  """Prints the predicted minutes to the target of N GPUs, a row for the
  tutorial's SGD ({towers: steps}) and one for the recipe ({towers:
  (steps, recipe)}) of each N: PCIe (ps) and NVLink (replicated) for each
  tower speed of docs/plot_scaling.py's step-cost model."""
  links = ((plot_scaling.PCIE_GB_S, 'PCIe', False),
           (plot_scaling.NVLINK_GB_S, 'NVLink', True))
  print('| GPUs | optimizer | steps to %.0f%% | %s |' % (
      100 * target, ' | '.join('%.0f ms, %s' % (ms, name)
                               for ms in plot_scaling.TOWER_MS
                               for _, name, _ in links)))
  print('| ---: | --- | ---: |' + ' ---: |' * (2 * len(plot_scaling.TOWER_MS)))
  for towers in sorted(set(recipes) | set(sgd)):
    for steps, name in ((sgd.get(towers), "the tutorial's SGD"),
                        recipes.get(towers, (None, ''))):
      if steps is None:
        continue
      if name != "the tutorial's SGD":
        name = label(name, towers)
      print('| %d | %s | %d | %s |' % (towers, name, steps, ' | '.join(
          '%.1f' % plot_scaling.predicted_minutes(
              steps * BATCH * towers, towers, ms, gb_s, replicated)
          for ms in plot_scaling.TOWER_MS for gb_s, _, replicated in links)))


def target_points(runs, target):
  """Returns [(batch, steps)], each number of towers' fewest mean steps to
  target (best_steps()), by batch: the points S(B) is fitted to."""
  return sorted((BATCH * t, s) for t, (s, _) in best_steps(
      runs, target).items())


def end_of_budget(seeds, recipe):
  """Returns the table's cell for the precision at the end of the
  recipe's budget (--train_epochs): each seed's last precision where it
  ran to that end, with the budget in epochs; '-' where none did."""
  budget = time_to_target.recipe_flags(recipe).get('train_epochs')
  if budget is None:
    return '-'
  ends = [points[-1][3] for points in seeds.values()
          if points[-1][2] >= float(budget) - plot_scaling.EPOCHS_ROUNDING]
  if not ends:
    return '-'
  return '%s%% (%s ep)' % (', '.join('%.1f' % (100 * p) for p in ends),
                           budget)


def print_targets(runs, targets):
  """Prints, per (towers, recipe), the mean steps (and millions of
  examples) to each target where every seed reached it, the best
  precision and the precision at the end of the budget; then, at each
  target, S(B) fitted to each number of towers' fewest steps."""
  print('| towers | recipe | seeds | %s | best | at the end |' % ' | '.join(
      'steps to %g%% (M examples)' % (100 * t) for t in targets))
  print('| ---: | --- | ---: |' + ' ---: |' * (len(targets) + 2))
  for (towers, recipe), seeds in sorted(runs.items()):
    cells = []
    for target in targets:
      steps = mean_steps(seeds, target)
      cells.append('-' if steps is None else '%d (%.2f)' % (
          steps, steps * BATCH * towers / 1e6))
    best = max(max(p[3] for p in points) for points in seeds.values())
    print('| %d | %s | %d | %s | %.1f%% | %s |' % (
        towers, label(recipe, towers), len(seeds), ' | '.join(cells),
        100 * best, end_of_budget(seeds, recipe)))
  print()
  for target in targets:
    points = target_points(runs, target)
    towers = ', '.join(str(b // BATCH) for b, _ in points)
    if len(points) < 2:
      print('%g%%: reached by %s tower(s) only: no fit' % (
          100 * target, towers or 'no'))
      continue
    s_min, b_crit = fit(points)
    print('%g%%: S_min %.0f steps, B_crit %.0f examples (towers %s)' % (
        100 * target, s_min, b_crit, towers))


def plot_targets(runs, targets, b_simple, out):
  """Draws what the batch costs near the top: left, each number of
  towers' fewest steps to each target against the batch with S(B) fitted
  at that target; right, the fitted B_crit against the target beside the
  gradient noise scale B_simple measured at it (b_simple: [(target,
  examples)], from docs/noise_scale.py). Returns {target: (S_min,
  B_crit)} where two or more numbers of towers reached the target."""
  fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.3))
  colors = itertools.cycle(('tab:blue', 'tab:green', 'tab:orange', 'tab:red'))
  fits = {}
  for target, color in zip(targets, colors):
    points = target_points(runs, target)
    if len(points) < 2:
      continue
    s_min, b_crit = fits[target] = fit(points)
    left.plot([b for b, _ in points], [s for _, s in points], 'o',
              color=color)
    left.plot(FIT_LINE, fitted_steps(s_min, b_crit), '-',
              color=color, label='%g%%: B_crit {:,.0f}'.format(b_crit) % (
                  100 * target))
  left.set_xscale('log', base=2)
  left.set_xticks(TOWER_BATCHES)
  left.set_xticklabels(['%d\n(%d)' % (b, b // BATCH) for b in TOWER_BATCHES])
  left.set_xlabel('examples a step (towers)')
  left.set_ylabel('steps to the target (precision @ 1)')
  left.set_title('Steps: S(B) = S_min (1 + B_crit / B), fitted', fontsize=10)
  shown = sorted(fits)
  right.plot([100 * t for t in shown], [fits[t][1] for t in shown], 'o-',
             color='tab:red', label='B_crit, fitted through the towers')
  right.plot([100 * t for t, _ in b_simple], [b for _, b in b_simple], 'x',
             color='tab:blue', ms=8, label='B_simple, measured at the crossing')
  right.set_xlabel('target: precision @ 1 (%)')
  right.set_ylabel('examples')
  right.set_title('The critical batch and the noise scale', fontsize=10)
  for axes in (left, right):
    log_y(axes)
    axes.grid(alpha=0.3, which='both')
    axes.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(out, dpi=110)
  return fits


def b_simple_arg(text):
  """Parses --b_simple=TARGET=EXAMPLES (e.g. 0.83=1092); returns
  (target, examples)."""
  target, _, examples = text.partition('=')
  try:
    return float(target), float(examples)
  except ValueError:
    raise argparse.ArgumentTypeError(
        '%r: give TARGET=EXAMPLES, e.g. 0.83=1092 (docs/noise_scale.py '
        'prints B_simple at each crossing)' % text)


def read_all(paths, contains=''):
  """Returns read_recipes() of every CSV in paths, put together, only the
  runs whose recipe contains the text contains (every run where empty)."""
  runs = {}
  for path in paths:
    runs.update(read_recipes(path))
  return {key: seeds for key, seeds in runs.items() if contains in key[1]}


def main():
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--collect', nargs='*', default=None)
  p.add_argument('--curves', action='append', required=True)
  p.add_argument('--sgd', default=None)
  p.add_argument('--cpu_sgd', default=None)
  p.add_argument('--out', default=None)
  p.add_argument('--target', type=float, default=TARGET)
  p.add_argument('--targets', default=None,
                 help='comma-separated targets, e.g. 0.78,0.8,0.82,0.83')
  p.add_argument('--answer', default=None,
                 help="draws the answer's picture (80%% and 83%%) here")
  p.add_argument('--sgd_long', default=None,
                 help="the tutorial's long one-tower run, step,precision")
  p.add_argument('--ceiling', default=None,
                 help="draws the ceiling's runs against epochs here")
  p.add_argument('--b_simple', action='append', default=[],
                 type=b_simple_arg,
                 help='with --targets and --out: a noise scale measured at '
                 'a target, TARGET=EXAMPLES (repeat it)')
  p.add_argument('--recipe_contains', default='',
                 help="only the runs whose recipe holds this text, e.g. "
                 "'--conv_weight_decay=0.0005 --fc_weight_decay=0.0005': "
                 "one family of recipes for the fits")
  args = p.parse_args()
  if args.collect is not None:
    collect(args.collect, args.curves[0])
    return
  runs = read_all(args.curves, args.recipe_contains)
  if not runs:
    sys.exit('Error: no run in %s has a recipe that contains %r: give text '
             'one of their recipe cells holds' % (
                 ', '.join(args.curves), args.recipe_contains))
  if args.ceiling:
    for (towers, seed, name), (epochs, precision) in sorted(plot_ceiling(
        runs, args.sgd_long, args.ceiling).items()):
      print('%s, %s: %.1f%% at %.0f epochs' % (
          run_name(towers, seed), name, 100 * precision, epochs))
    return
  if args.answer:
    sgd = {}
    for target in ANSWER_TARGETS:
      steps = sgd_steps(args.sgd, args.cpu_sgd, target).get(1) if (
          args.sgd) else None
      if steps is None and args.sgd_long:
        steps = first_step_at(args.sgd_long, target)
      if steps is not None:
        sgd[target] = steps
    for target, reached in plot_answer(runs, sgd, args.answer).items():
      print('%.0f%%: %s' % (100 * target, '; '.join(
          '%d towers %s (%d of %d seeds)' % (
              t, '..'.join(str(s) for s in sorted({hits[0], hits[-1]})),
              len(hits), seeds) for t, (hits, seeds) in sorted(
                  reached.items()))))
    return
  if args.targets:
    targets = [float(t) for t in args.targets.split(',')]
    print_targets(runs, targets)
    if args.out:
      plot_targets(runs, targets, args.b_simple, args.out)
    return
  print_recipes(runs, args.target)
  best = best_steps(runs, args.target)
  sgd = sgd_steps(args.sgd, args.cpu_sgd, args.target) if args.sgd else {}
  if sgd and args.out:
    fits = plot(sgd, {t: s for t, (s, _) in best.items()}, args.out,
                args.target)
    print()
    for name, (s_min, b_crit) in fits.items():
      print('%s: S_min %.0f steps, B_crit %.0f examples' % (
          name, s_min, b_crit))
  print()
  print_minutes(best, sgd, args.target)

if __name__ == '__main__':
  main()
