"""Draws one traced training step: a lane per device, ops as bars.

TRACE is a Chrome trace of one step, as the trainers write it with
--trace_steps (<train_dir>/trace-step-N.json). Each lane is a device that
ran ops: the CPU that holds the variables and runs the input pipeline,
each tower's device (a GPU's CUDA streams and copies each get a lane),
and within a lane a row per thread. Each op is a bar from its start to
its end, coloured by its part of the step: the input, the forward pass,
the backward pass, the averaging of the gradients (or their all-reduce),
the update with the moving averages, the copies between devices. It
also prints, per part, the op time on each lane and its share of the
step.

Usage (matplotlib comes with requirements-dev.txt):
  python docs/plot_timeline.py /tmp/cifar10_train/trace-step-100.json \\
      --out=step100.png
"""

import argparse
import collections
import json
import re

import matplotlib  # pylint: disable=g-import-not-at-top
matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

# The parts of a step, in the order they come, and their colours.
PARTS = collections.OrderedDict([
    ('input', '#8c8c8c'),
    ('forward', '#1f77b4'),
    ('backward', '#ff7f0e'),
    ('averaging', '#d62728'),
    ('update and moving averages', '#2ca02c'),
    ('copies between devices', '#9467bd'),
    ('other', '#e0e0e0'),
])

# The ops of the update: gradient descent, the moving averages of the
# variables and the losses, the global step, the learning rate.
UPDATE_SCOPES = ('GradientDescent', 'ExponentialMovingAverage', 'avg',
                 'global_step', 'ExponentialDecay', 'sync_replicas',
                 'broadcast')


def part_of(node, op, lane):
  """The part of the step an op belongs to, by its name and type.

  Args:
    node: the op's name, e.g. 'tower_1/gradients/tower_1/conv2/...'.
    op: its type, e.g. 'Conv2DBackpropFilter'.
    lane: the name of its lane.

  Returns:
    A key of PARTS.
  """
  if op in ('_Send', '_Recv', '_HostSend', '_HostRecv') or (
      'memcpy' in lane.lower() or 'MEMCPY' in op.upper()):
    return 'copies between devices'
  if 'IteratorGetNext' in node or 'Iterator' in op:
    return 'input'
  if 'average_gradients/' in node or 'all_reduce' in node or (
      op.startswith('Collective')):
    return 'averaging'
  if 'gradients/' in node:
    return 'backward'
  if re.sub(r'^tower_\d+/', '', node).split('/')[0] in UPDATE_SCOPES:
    return 'update and moving averages'
  if re.match(r'(tower_\d+/)?(conv|pool|norm|local|softmax_linear|'
              r'cross_entropy|total_loss)', node):
    return 'forward'
  return 'other'


def read_trace(path):
  """Reads a Chrome trace's ops, lane by lane.

  Returns:
    {lane name: [(thread, start, duration, part)]}, microseconds from the
    step's first op; a GPU's 'stream:all' lane (the sum of its streams)
    and memory lanes are left out.
  """
  with open(path) as f:
    events = json.load(f)['traceEvents']
  names = {e['pid']: e['args']['name'] for e in events
           if e.get('ph') == 'M' and e.get('name') == 'process_name'}
  ops = [e for e in events if e.get('ph') == 'X']
  start = min(e['ts'] for e in ops)
  lanes = collections.defaultdict(list)
  for e in ops:
    lane = names.get(e['pid'], str(e['pid']))
    if not lane.endswith('Compute') or 'stream:all' in lane:
      continue
    lane = re.sub(r'^.*device:|\s*Compute$', '', lane)
    node = e.get('args', {}).get('name', e['name'])
    op = e.get('args', {}).get('op', e['name'])
    node, _, typed = node.partition(':')  # GPU kernels: 'name:OpType'.
    lanes[lane].append((e['tid'], e['ts'] - start, e.get('dur', 0),
                        part_of(node, typed or op, lane)))
  return lanes


def _busy(ops):
  """Microseconds in which at least one of ops runs."""
  busy, end = 0, None
  for _, start, duration, _ in sorted(ops, key=lambda op: op[1]):
    if end is None or start > end:
      busy += duration
      end = start + duration
    elif start + duration > end:
      busy += start + duration - end
      end = start + duration
  return busy


def print_shares(lanes):
  """Prints, per part, each lane's op time and its share of all the op
  time; then how much of the step each lane was busy."""
  step = max(t + d for ops in lanes.values() for _, t, d, _ in ops)
  names = sorted(lanes)
  total = sum(d for ops in lanes.values() for _, _, d, _ in ops)
  print('step: %.1f ms from its first op to its last' % (step / 1e3))
  print('| part | %s | share of the op time |' % ' | '.join(
      '%s (ms)' % lane for lane in names))
  print('| --- |%s ---: |' % (' ---: |' * len(names)))
  for part in PARTS:
    times = [sum(d for _, _, d, p in lanes[lane] if p == part)
             for lane in names]
    if any(times):
      print('| %s | %s | %.0f%% |' % (
          part, ' | '.join('%.1f' % (t / 1e3) for t in times),
          100.0 * sum(times) / total))
  print('| busy, share of the step | %s | |' % ' | '.join(
      '%.0f%%' % (100.0 * _busy(lanes[lane]) / step) for lane in names))


def plot(lanes, out, title):
  """Draws the lanes, a row per thread, into the PNG out."""
  rows = []  # (lane, thread), top to bottom.
  for lane in sorted(lanes):
    rows.extend((lane, tid) for tid in sorted({t for t, _, _, _ in
                                                lanes[lane]}))
  fig, ax = plt.subplots(figsize=(12, 1.4 + 0.35 * len(rows)))
  for y, (lane, tid) in enumerate(reversed(rows)):
    for part in PARTS:
      bars = [(t / 1e3, max(d, 1) / 1e3) for thread, t, d, p in lanes[lane]
              if thread == tid and p == part]
      ax.broken_barh(bars, (y + 0.1, 0.8), color=PARTS[part],
                     edgecolor='none')
  ax.set_yticks([y + 0.5 for y in range(len(rows))])
  ax.set_yticklabels(['%s, thread %d' % row for row in reversed(rows)],
                     fontsize=8)
  ax.set_xlabel('milliseconds from the step\'s first op')
  ax.set_title(title)
  ax.legend(handles=[matplotlib.patches.Patch(color=c, label=p)
                     for p, c in PARTS.items()],
            loc='upper left', bbox_to_anchor=(1.01, 1.0), fontsize=8)
  fig.tight_layout()
  fig.savefig(out, dpi=100)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('trace', help='a trace-step-N.json file')
  parser.add_argument('--out', required=True, help='the PNG to write')
  parser.add_argument('--title', default=None,
                      help='the picture\'s title; default: the trace file')
  args = parser.parse_args()
  lanes = read_trace(args.trace)
  print_shares(lanes)
  plot(lanes, args.out, args.title or args.trace)


if __name__ == '__main__':
  main()
