"""Steps/sec of the distributed trainer's two modes on this machine's loopback.

Starts clusters of cifar10_distributed_train.py on 127.0.0.1, one tower
per worker: 1 ps task + N workers (parameter servers, synchronous), and N
workers alone (all-reduce). Each trains --warmup + --steps steps; the rate
is read from the chief's step lines after the warm-up (global steps per
second: every step is one synchronous update of all N workers). The
clusters take turns, mode by mode and size by size, --rounds times over,
so that a machine whose speed drifts slows each alike.

Usage:
  python docs/cluster_speed.py --data_dir=/tmp/cifar10_data --workers=2,4 \\
      --rounds=3
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import argparse
import datetime
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINER = os.path.join(REPO, 'cifar10_distributed_train.py')
sys.path.insert(0, REPO)

from machinery.cluster import free_local_ports  # pylint: disable=g-import-not-at-top,wrong-import-position

MODES = ('parameter_server', 'all-reduce')

# The chief's step line: 'Worker 0: <datetime>: step N, loss = ...'.
STEP_LINE = re.compile(r'^Worker 0: (\S+ \S+): step (\d+), loss', re.M)


def run_cluster(mode, num_workers, args, work_dir):
  """Runs one cluster to the end.

  Args:
    mode: one of MODES.
    num_workers: workers, one tower each.
    args: the parsed command line.
    work_dir: where the chief's --train_dir goes.

  Returns:
    The chief's global steps per second after the warm-up.

  Raises:
    RuntimeError: a task failed.
  """
  ports = free_local_ports(num_workers + 1)
  hosts = ['--worker_hosts=' + ','.join(
      '127.0.0.1:%d' % p for p in ports[1:])]
  if mode == 'parameter_server':
    hosts.append('--ps_hosts=127.0.0.1:%d' % ports[0])
  common = hosts + [
      '--data_dir=' + args.data_dir, '--batch_size=%d' % args.batch_size,
      '--max_steps=%d' % (args.warmup + args.steps), '--log_frequency=10',
      '--save_checkpoint_steps=100000', '--save_summaries_steps=100000',
      '--train_dir=' + tempfile.mkdtemp(dir=work_dir)]
  tasks = [['--job_name=worker', '--task_index=%d' % i]
           for i in range(num_workers)]
  if mode == 'parameter_server':
    tasks.insert(0, ['--job_name=ps', '--task_index=0'])
  # Files, not pipes: a pipe nobody reads yet could stall a task.
  logs = [tempfile.TemporaryFile('w+', dir=work_dir) for _ in tasks]
  processes = [subprocess.Popen([sys.executable, TRAINER] + task + common,
                                stdout=log, stderr=subprocess.STDOUT,
                                text=True)
               for task, log in zip(tasks, logs)]
  outputs = []
  for process, log in zip(processes, logs):
    process.wait(timeout=args.timeout)
    log.seek(0)
    outputs.append(log.read())
    if process.returncode:
      raise RuntimeError('%s %d workers: a task exited %d:\n%s'
                         % (mode, num_workers, process.returncode,
                            outputs[-1][-2000:]))
  chief_out = outputs[1 if mode == 'parameter_server' else 0]
  points = [(datetime.datetime.strptime(t, '%Y-%m-%d %H:%M:%S.%f'), int(s))
            for t, s in STEP_LINE.findall(chief_out) if int(s) >= args.warmup]
  (t0, s0), (t1, s1) = points[0], points[-1]
  return (s1 - s0) / (t1 - t0).total_seconds()


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--data_dir', default='/tmp/cifar10_data')
  parser.add_argument('--workers', default='2,4',
                      help='cluster sizes to run, comma-separated')
  parser.add_argument('--batch_size', type=int, default=128,
                      help='per worker')
  parser.add_argument('--warmup', type=int, default=20)
  parser.add_argument('--steps', type=int, default=100)
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--timeout', type=int, default=1800,
                      help='seconds one cluster may take')
  args = parser.parse_args()
  sizes = [int(n) for n in args.workers.split(',')]
  rates = {(mode, n): [] for n in sizes for mode in MODES}
  with tempfile.TemporaryDirectory() as work_dir:
    for round_ in range(args.rounds):
      for n in sizes:
        for mode in MODES:
          rates[mode, n].append(run_cluster(mode, n, args, work_dir))
          print('round %d: %s, %d workers: %.2f steps/sec'
                % (round_ + 1, mode, n, rates[mode, n][-1]))
          sys.stdout.flush()
  print()
  print('| workers | mode | steps/sec (median) | min..max | examples/sec |')
  print('| ---: | --- | ---: | --- | ---: |')
  for n in sizes:
    for mode in MODES:
      median = np.median(rates[mode, n])
      print('| %d | %s | %.2f | %.2f..%.2f | %.0f |'
            % (n, mode, median, min(rates[mode, n]), max(rates[mode, n]),
               median * n * args.batch_size))


if __name__ == '__main__':
  main()
