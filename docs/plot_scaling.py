"""What more towers buy: precision at the same epochs, and examples/sec.

Left, precision @ 1 against the number of towers, from a CSV of runs
(`towers,scaling,seed,steps,ema,raw` lines: the rate unscaled, `none`, or
by the linear rule with a warm-up, `linear`), each seed a point, the mean
a line. Right, the examples/sec that the model of docs/scaling.md
predicts for N GPUs, over PCIe and over NVLink, for a fast and a slow
tower, with the tutorial's K20m figures beside them. Prints both as
tables, and the prediction for M machines over a network.

Usage (matplotlib comes with requirements-dev.txt), the picture in
docs/scaling.md:
  python docs/plot_scaling.py --runs=docs/scaling_precision.csv \\
      --out=docs/scaling.png
"""

import argparse
import collections
import csv

import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

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


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--runs', required=True,
                      help='CSV: towers,scaling,seed,steps,ema,raw')
  parser.add_argument('--out', required=True, help='the PNG to write')
  args = parser.parse_args()
  runs = read_runs(args.runs)
  print_precision(runs)
  print()
  print_predictions()
  plot(runs, args.out)
  print()
  print('Wrote', args.out)


if __name__ == '__main__':
  main()
