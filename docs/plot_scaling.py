"""What more towers buy: precision at the same epochs, time to 80%, and
examples/sec.

Left, precision @ 1 against the number of towers, from a CSV of runs
(`towers,scaling,seed,steps,ema,raw` lines: the rate unscaled, `none`, or
by the linear rule with a warm-up, `linear`), each seed a point, the mean
a line. Right, the examples/sec that the model of docs/scaling.md
predicts for N GPUs, over PCIe and over NVLink, for a fast and a slow
tower, with the tutorial's K20m figures beside them. Prints both as
tables, and the prediction for M machines over a network.

With --curves (the evaluations of docs/time_to_target.py's runs, its
curve.csv lines put together) it also prints the steps, examples and
epochs each configuration took to reach --target, and the minutes that
takes on N GPUs and M machines by the model (examples to the target over
predicted examples/sec), and draws into --out_time precision against
examples (left) and minutes to the target against GPUs (right), with the
minutes measured on this CPU (--cpu_runs, cifar10_train.py's runs).

Usage (matplotlib comes with requirements-dev.txt), the pictures in
docs/scaling.md:
  python docs/plot_scaling.py --runs=docs/scaling_precision.csv \\
      --out=docs/scaling.png --curves=docs/time_to_80.csv \\
      --cpu_runs=docs/time_to_80_cpu.csv --out_time=docs/time_to_80.png
"""

import argparse
import collections
import csv
import math

import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
from matplotlib import ticker  # pylint: disable=g-import-not-at-top

# The model's 1,068,298 float32 parameters: the variables a tower reads and
# the gradients it sends, each step.
PARAMETER_BYTES = 1068298 * 4
BATCH = 128

# Measured on this project's 2-core machine (docs/towers.md, docs/
# measurements.md): the averaging on /cpu:0 per tower's gradients, the
# update and moving averages, and the input pipeline's examples/sec per
# core (25,000 on 2 cores).
AVERAGE_MS_PER_TOWER = 1.3
UPDATE_MS = 2.4
INPUT_PER_CORE = 12500
# The CPU cores of the GPU machine predicted for.
CORES = 8

# Links, GB/s each way: a GPU's PCIe 3.0 x16 slot, NVLink between GPUs, a
# 10 Gbit/s network.
PCIE_GB_S = 12.0
NVLINK_GB_S = 100.0
NETWORK_GB_S = 1.25

# One tower's forward and backward pass of 128 examples on one GPU, ms: a
# modern GPU (3 ms: 100K steps in 5 minutes), an older one, and the
# tutorial's K20m step (0.35 s/batch at best on one GPU).
TOWER_MS = (3.0, 30.0, 350.0)

# The tutorial's table (sec/batch = a step's time / the GPUs), as
# (GPUs, lowest, highest examples/sec), batch 128 a tower.
TUTORIAL_K20M = [(1, 128 / 0.60, 128 / 0.35), (2, 128 / 0.20, 128 / 0.13),
                 (3, 128 / 0.18, 128 / 0.13), (4, 128 / 0.10, 128 / 0.10)]

TOWERS = (1, 2, 4, 8)

# The precision the runs of --curves train to, and the epochs after which
# one that has not reached it ends (docs/time_to_target.py's defaults).
TARGET = 0.80
MAX_EPOCHS = 100
# The curves give epochs to two decimals: a run within this of its budget
# ran to its end.
EPOCHS_ROUNDING = 0.01
# A run below GIVE_UP_BELOW after GIVE_UP_EPOCHS may end there.
GIVE_UP_BELOW = 0.70
GIVE_UP_EPOCHS = 50


def step_ms(towers, tower_ms, link_gb_s, replicated=False):
  """Predicts one synchronous step's time, ms.

  Parameter server (the tutorial's): each GPU reads the variables from
  /cpu:0 and sends its gradients back over its own link, the CPU averages
  the towers' gradients and applies the update. Replicated: an all-reduce
  between the GPUs (a ring: 2(N-1)/N of the gradients each way), the
  update on each GPU, too small to count.

  Args:
    towers: N, one a GPU.
    tower_ms: one tower's forward and backward pass.
    link_gb_s: the bandwidth of each GPU's link, GB/s each way.
    replicated: the all-reduce instead of the parameter server.

  Returns:
    The step's milliseconds, nothing overlapped.
  """
  megabytes = PARAMETER_BYTES / 1e6
  if replicated:
    return tower_ms + 2 * (towers - 1) / towers * megabytes / link_gb_s
  return (tower_ms + 2 * megabytes / link_gb_s +
          AVERAGE_MS_PER_TOWER * towers + UPDATE_MS)


def examples_per_sec(towers, tower_ms, link_gb_s, replicated=False,
                     cores=CORES):
  """Predicts examples/sec: N batches a step, at most what the input
  pipeline makes on cores CPU cores."""
  return min(towers * BATCH * 1000 / step_ms(towers, tower_ms, link_gb_s,
                                             replicated),
             cores * INPUT_PER_CORE)


def machines_step_ms(machines, tower_ms, all_reduce):
  """Predicts a step of M machines of one GPU each over NETWORK_GB_S.

  One ps task takes M gradients in and sends M copies of the variables
  out; an all-reduce worker sends and receives 2(M-1)/M of them each way
  (docs/distributed.md, "What a step moves over the network").
  """
  megabytes = PARAMETER_BYTES / 1e6
  if all_reduce:
    return tower_ms + 2 * (machines - 1) / machines * megabytes / NETWORK_GB_S
  return tower_ms + machines * megabytes / NETWORK_GB_S + UPDATE_MS


def read_runs(path):
  """Reads the runs CSV: {scaling: {towers: [(seed, ema, raw)]}}."""
  runs = collections.defaultdict(lambda: collections.defaultdict(list))
  with open(path) as f:
    for row in csv.DictReader(line for line in f if not line.startswith('#')):
      runs[row['scaling']][int(row['towers'])].append(
          (int(row['seed']), float(row['ema']), float(row['raw'] or 'nan')))
  return runs


def print_precision(runs):
  """Prints a table row per scaling and towers: precision min..max."""
  print('| towers | rate | seeds | precision @ 1, moving averages | raw '
        'weights |')
  print('| ---: | --- | ---: | --- | --- |')
  # By towers, the unscaled rate first.
  for towers, _, scaling in sorted((towers, scaling != 'none', scaling)
                                   for scaling in runs
                                   for towers in runs[scaling]):
    points = runs[scaling][towers]
    emas = [ema for _, ema, _ in points]
    raws = [raw for _, _, raw in points if raw == raw]  # Not NaN.
    print('| %d | %s | %d | %.1f..%.1f%% | %s |' % (
        towers, scaling, len(points), 100 * min(emas), 100 * max(emas),
        '%.1f..%.1f%%' % (100 * min(raws), 100 * max(raws)) if raws
        else '-'))


def print_predictions():
  """Prints the predicted examples/sec for N GPUs and the step for M
  machines."""
  print('| towers (GPUs) | tower ms | PCIe, ps | PCIe, replicated | '
        'NVLink, replicated | speed-up over 1 (PCIe, ps) | PCIe, ps, 2 '
        'cores |')
  print('| ---: | ---: | ---: | ---: | ---: | ---: | ---: |')
  for tower_ms in TOWER_MS:
    one = examples_per_sec(1, tower_ms, PCIE_GB_S)
    for towers in TOWERS:
      ps = examples_per_sec(towers, tower_ms, PCIE_GB_S)
      print('| %d | %.0f | %.0f | %.0f | %.0f | %.2fx | %.0f |' % (
          towers, tower_ms, ps,
          examples_per_sec(towers, tower_ms, PCIE_GB_S, True),
          examples_per_sec(towers, tower_ms, NVLINK_GB_S, True), ps / one,
          examples_per_sec(towers, tower_ms, PCIE_GB_S, cores=2)))
  print()
  print('| machines | tower ms | step, one ps task | examples/sec | step, '
        'all-reduce | examples/sec |')
  print('| ---: | ---: | ---: | ---: | ---: | ---: |')
  for tower_ms in TOWER_MS:
    for machines in (2, 4, 8, 16):
      ps = machines_step_ms(machines, tower_ms, False)
      ring = machines_step_ms(machines, tower_ms, True)
      print('| %d | %.0f | %.1f ms | %.0f | %.1f ms | %.0f |' % (
          machines, tower_ms, ps, machines * BATCH * 1000 / ps, ring,
          machines * BATCH * 1000 / ring))


def _mean_percent(points):
  """Returns the mean moving-average precision of (seed, ema, raw) points,
  in percent."""
  return 100 * sum(ema for _, ema, _ in points) / len(points)


def plot(runs, out):
  """Draws precision against towers (left) and the predicted examples/sec
  (right) into out."""
  fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
  for scaling, color in (('none', 'tab:blue'), ('linear', 'tab:orange')):
    if scaling not in runs:
      continue
    label = {'none': 'rate 0.1 unscaled',
             'linear': 'linear rule, 2-epoch warm-up'}[scaling]
    means = {n: _mean_percent(points) for n, points in runs[scaling].items()}
    for n, points in runs[scaling].items():
      left.scatter([n] * len(points), [100 * ema for _, ema, _ in points],
                   color=color, s=18)
    if 1 not in means and 1 in runs.get('none', {}):
      # On one tower the linear rule multiplies the rate by 1: the same run.
      means[1] = _mean_percent(runs['none'][1])
    left.plot(sorted(means), [means[n] for n in sorted(means)], color=color,
              label=label + ' (measured)')
  left.set_xscale('log', base=2)
  left.set_xticks(TOWERS, [str(n) for n in TOWERS])
  left.set_xlabel('towers of 128 (virtual devices on the CPU)')
  left.set_ylabel('precision @ 1 after 10 epochs, %')
  left.legend()
  left.grid(alpha=0.3)
  for tower_ms, style in zip(TOWER_MS, ('-', '--', ':')):
    for link, name, replicated in ((PCIE_GB_S, 'PCIe, ps', False),
                                   (NVLINK_GB_S, 'NVLink, replicated', True)):
      if replicated and tower_ms > 100:
        continue  # The tutorial's GPUs had no NVLink.
      right.plot(TOWERS, [examples_per_sec(n, tower_ms, link, replicated)
                          for n in TOWERS], style,
                 label='predicted: %s, tower %.0f ms' % (name, tower_ms))
  right.vlines([n for n, _, _ in TUTORIAL_K20M],
               [low * 0.97 for _, low, _ in TUTORIAL_K20M],
               [high * 1.03 for _, _, high in TUTORIAL_K20M], color='black',
               lw=4, label="tutorial's K20m table (measured)")
  right.set_xscale('log', base=2)
  right.set_yscale('log')
  right.set_xticks(TOWERS + (3,), [str(n) for n in TOWERS + (3,)])
  right.set_xlabel('GPUs, one tower each')
  right.set_ylabel('examples/sec')
  right.legend(fontsize=7, loc='lower right')
  right.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(out, dpi=100)


def read_curves(path):
  """Reads docs/time_to_target.py's evaluations (a CSV of its curve.csv
  lines): {(towers, rate, warm-up epochs): {seed: [(step, examples, epochs,
  precision, wall seconds or None)], in step order}}."""
  curves = collections.defaultdict(lambda: collections.defaultdict(list))
  with open(path) as f:
    for row in csv.DictReader(line for line in f if not line.startswith('#')):
      curves[int(row['towers']), row['rate'], float(row['warmup_epochs'])][
          int(row['seed'])].append((
              int(row['step']), int(row['examples']), float(row['epochs']),
              float(row['precision']),
              float(row['wall_s']) if row['wall_s'] else None))
  for runs in curves.values():
    for points in runs.values():
      points.sort()
  return curves


def config_order(key):
  """Orders configurations (towers, rate, warm-up): by towers, the
  unscaled rate first."""
  return key[0], key[1] != 'none', key


def crossing(points, target=TARGET):
  """Returns the first evaluation of a run at target or more, or None."""
  return next((p for p in points if p[3] >= target), None)


def run_end(points, target=TARGET):
  """Words how a run ended: its crossing, or why it has none (a last
  precision of nan: the loss diverged there)."""
  reached = crossing(points, target)
  if reached:
    return 'reached'
  best = 100 * max(p[3] for p in points if not math.isnan(p[3]))
  if math.isnan(points[-1][3]):
    return 'diverged at %.1f epochs (best %.1f%%)' % (points[-1][2], best)
  if points[-1][2] >= MAX_EPOCHS - EPOCHS_ROUNDING:
    return 'not reached in %d epochs (best %.1f%%)' % (MAX_EPOCHS, best)
  if points[-1][2] >= GIVE_UP_EPOCHS and best < 100 * GIVE_UP_BELOW:
    return 'stopped at %.0f epochs, below %.0f%%' % (
        points[-1][2], 100 * GIVE_UP_BELOW)
  return 'stopped at %.0f epochs (best %.1f%%)' % (points[-1][2], best)


def rate_label(towers, rate, warmup):
  """Names a configuration's learning rate: 'rate 0.1 unscaled', 'linear
  rule (0.4), 2-epoch warm-up', 'linear rule from 0.05 (0.4), 5-epoch
  warm-up' (rate: 'none', 'linear', or the --initial_learning_rate the
  linear rule scaled)."""
  if rate == 'none':
    return 'rate 0.1 unscaled'
  initial = 0.1 if rate == 'linear' else float(rate)
  return 'linear rule %s(%g), %g-epoch warm-up' % (
      '' if rate == 'linear' else 'from %g ' % initial, initial * towers,
      warmup)


def print_time_to_target(curves, cpu_curves=None, target=TARGET):
  """Prints a row per configuration: its seeds' steps, examples and epochs
  to target (min..max, one value where they agree), or how the runs
  ended; cpu_curves' rows (of cifar10_train.py, so named) first."""
  print('| towers | learning rate | seeds | steps to %.0f%% | examples '
        '(millions) | epochs | runs |' % (100 * target))
  print('| ---: | --- | ---: | --- | --- | --- | --- |')
  _print_target_rows(cpu_curves or {}, ', cifar10_train.py', target)
  _print_target_rows(curves, '', target)


def _print_target_rows(curves, trainer, target):
  """Prints print_time_to_target's rows of curves, trainer after the
  towers; a spread of one value as that value."""
  for key in sorted(curves, key=config_order):
    runs = curves[key]
    hits = [crossing(points, target) for points in runs.values()]
    hits = [hit for hit in hits if hit]
    def spread(i, scale=1, fmt='%d'):
      if not hits:
        return '-'
      low, high = (fmt % (f([hit[i] for hit in hits]) / scale)
                   for f in (min, max))
      return low if low == high else low + '..' + high
    print('| %d%s | %s | %d | %s | %s | %s | %s |' % (
        key[0], trainer, rate_label(*key), len(runs), spread(0),
        spread(1, 1e6, '%.2f'), spread(2, 1, '%.1f'), '; '.join(
            'seed %d %s' % (seed, run_end(points, target))
            for seed, points in sorted(runs.items()))))


def examples_to_target(curves, target=TARGET):
  """Returns {towers: (the fewest mean examples to target over the
  configurations of that many towers whose every run reached it, that
  configuration's rate label)}."""
  best = {}
  for (towers, rate, warmup), runs in curves.items():
    hits = [crossing(points, target) for points in runs.values()]
    if not hits or not all(hits):
      continue
    mean = sum(hit[1] for hit in hits) / len(hits)
    if towers not in best or mean < best[towers][0]:
      best[towers] = (mean, rate_label(towers, rate, warmup))
  return best


def predicted_minutes(examples, towers, tower_ms, link_gb_s, replicated):
  """Predicts the minutes N GPUs take to train on examples examples."""
  return examples / examples_per_sec(towers, tower_ms, link_gb_s,
                                     replicated) / 60


def print_predicted_minutes(best, target=TARGET):
  """Prints the predicted minutes to the target for N GPUs and M machines,
  from examples_to_target's result."""
  print('| GPUs | learning rate | examples to %.0f%% (millions) | tower '
        'ms | PCIe, ps | NVLink, replicated | machines over 10 Gbit/s, one '
        'ps task | all-reduce |' % (100 * target))
  print('| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |')
  for towers in sorted(best):
    examples, label = best[towers]
    for tower_ms in TOWER_MS:
      minutes = [predicted_minutes(examples, towers, tower_ms, link, rep)
                 for link, rep in ((PCIE_GB_S, False), (NVLINK_GB_S, True))]
      machines = [examples / (towers * BATCH * 1000 / machines_step_ms(
          towers, tower_ms, all_reduce)) / 60 for all_reduce in (False, True)]
      print('| %d | %s | %.2f | %.0f | %.1f | %.1f | %.1f | %.1f |' % (
          towers, label, examples / 1e6, tower_ms, minutes[0], minutes[1],
          machines[0], machines[1]))


def plot_time(curves, cpu_curves, cpu_minutes, best, out, target=TARGET):
  """Draws precision against examples (left) and minutes to target against
  GPUs, predicted, with this CPU's measured minutes (right), into out."""
  fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
  _plot_curves(left, curves, cpu_curves, target)
  gpus = sorted(best)
  for tower_ms, style in zip(TOWER_MS[:2], ('-', '--')):
    for link, name, replicated in ((PCIE_GB_S, 'PCIe, ps', False),
                                   (NVLINK_GB_S, 'NVLink, replicated', True)):
      right.plot(gpus, [predicted_minutes(best[n][0], n, tower_ms, link,
                                          replicated) for n in gpus],
                 style, marker='o', label='predicted: %s, tower %.0f ms' % (
                     name, tower_ms))
  if cpu_minutes:
    right.scatter([1] * len(cpu_minutes), cpu_minutes, color='black',
                  marker='x', zorder=3,
                  label="this project's 2 CPU cores, cifar10_train.py "
                  "(measured)")
  right.set_xscale('log', base=2)
  right.set_yscale('log')
  right.yaxis.set_major_formatter(ticker.FormatStrFormatter('%g'))
  right.yaxis.set_minor_formatter(ticker.NullFormatter())
  right.set_xticks(gpus, [str(n) for n in gpus])
  right.set_xlabel('GPUs, one tower each')
  right.set_ylabel('minutes to %.0f%%' % (100 * target))
  right.legend(fontsize=7)
  right.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(out, dpi=100)


def _plot_curves(axes, curves, cpu_curves, target):
  """Draws each run's precision against its examples on axes, a color per
  number of towers, a line style per rate; cifar10_train.py's runs (one
  tower) in black; an x where a run's loss diverged."""
  colors = dict(zip(TOWERS, ('black', 'tab:blue', 'tab:green', 'tab:red')))
  styles = {}
  named = [(key, curves[key], '') for key in sorted(curves, key=config_order)]
  named += [(key, cpu_curves[key], ', cifar10_train.py')
            for key in sorted(cpu_curves, key=config_order)]
  for key, runs, trainer in named:
    style = styles.setdefault((key[1], key[2]), ('-', '--', ':', '-.')[
        len(styles) % 4])
    color = colors.get(key[0], 'gray')
    for i, (_, points) in enumerate(sorted(runs.items())):
      finite = [p for p in points if not math.isnan(p[3])]
      axes.plot([p[1] / 1e6 for p in finite], [100 * p[3] for p in finite],
                style, color=color, lw=1, label=None if i else
                '%d tower(s)%s, %s' % (key[0], trainer, rate_label(*key)))
      if len(finite) < len(points):
        axes.plot(finite[-1][1] / 1e6, 100 * finite[-1][3], 'x',
                  color=color, ms=8)
  axes.axhline(100 * target, color='gray', lw=0.8)
  axes.set_ylim(0, 85)
  axes.set_xlabel('training examples (millions; 50,000 an epoch); '
                  'x: the loss diverged')
  axes.set_ylabel('precision @ 1, moving averages, %')
  axes.legend(fontsize=7, loc='lower right')
  axes.grid(alpha=0.3)


def cpu_minutes_to_target(cpu_curves, target=TARGET):
  """Returns the minutes each run of cpu_curves (docs/time_to_target.py's
  evaluations of cifar10_train.py runs) took to its first checkpoint at
  target or more."""
  return [crossing(points, target)[4] / 60
          for runs in cpu_curves.values()
          for points in runs.values() if crossing(points, target)]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--runs', required=True,
                      help='CSV: towers,scaling,seed,steps,ema,raw')
  parser.add_argument('--out', required=True, help='the PNG to write')
  parser.add_argument('--curves', help='CSV of docs/time_to_target.py '
                      'evaluations, for the time to the target')
  parser.add_argument('--cpu_runs', help='the same of cifar10_train.py '
                      'runs, timed on this CPU')
  parser.add_argument('--out_time', help='the PNG of the time to the target')
  args = parser.parse_args()
  runs = read_runs(args.runs)
  print_precision(runs)
  print()
  print_predictions()
  plot(runs, args.out)
  print()
  print('Wrote', args.out)
  if args.curves:
    curves = read_curves(args.curves)
    cpu_curves = read_curves(args.cpu_runs) if args.cpu_runs else {}
    best = examples_to_target(curves)
    # One tower of cifar10_train.py is the multi-GPU trainer's one tower.
    for towers, (examples, label) in examples_to_target(cpu_curves).items():
      best.setdefault(towers, (examples, label + ', cifar10_train.py'))
    cpu = cpu_minutes_to_target(cpu_curves)
    print()
    print_time_to_target(curves, cpu_curves)
    print()
    print_predicted_minutes(best)
    if cpu:
      print()
      print('This CPU, cifar10_train.py to %.0f%%: %s minutes' % (
          100 * TARGET, ', '.join('%.1f' % m for m in sorted(cpu))))
    if args.out_time:
      plot_time(curves, cpu_curves, cpu, best, args.out_time)
      print('Wrote', args.out_time)


if __name__ == '__main__':
  main()
