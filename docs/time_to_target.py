"""Trains until the evaluator says a target precision is reached: time to 80%.

Runs a trainer (cifar10_multi_gpu_train.py with N towers, or
cifar10_train.py) with a checkpoint every epoch, cifar10_eval.py beside it
at low priority evaluating each new checkpoint, and stops both when a
checkpoint evaluates at --target or more, when --max_epochs are done, or
when the run is still below --give_up_below at --give_up_epochs. Every
evaluation goes to OUT/curve.csv as it comes; the last line printed says
how the run ended. The trainer writes OUT/log, the evaluator OUT/eval_log.
Run it again on the same --out_dir to resume.

    python docs/time_to_target.py --towers=4 --seed=1 --data_dir=D \\
        --out_dir=~/long/t4_none_s1 [--learning_rate_scaling=linear \\
        --warmup_epochs=2] [--trainer=cifar10_train.py] \\
        [--recipe="--optimizer=momentum --lr_schedule=cosine --train_epochs=18"]

Its CSV, one line per evaluated checkpoint: towers, rate (none, linear or
the --initial_learning_rate given), warmup_epochs, seed, step, examples,
epochs, precision, wall_s: seconds of training from the run's start to the
checkpoint's write (after a resume the clock goes on from where the
stopped command left it, without the time the run stood stopped; blank
where that earlier clock is lost), and recipe: the --recipe flags (empty: the tutorial's SGD). A run whose loss
diverged ends with a row of precision nan at the step that diverged. A
recipe with --train_epochs=E ends there: E stands for --max_epochs.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import argparse
import csv
import glob
import math
import os
import re
import signal
import subprocess
import sys
import time

import event_files

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLES_PER_EPOCH = 50000
BATCH_SIZE = 128
POLL_SECS = 5
# The evaluator's priority: low, but high enough to evaluate every epoch's
# checkpoint before the next (at 19 it starves beside the trainer).
NICE = 5
FIELDS = ['towers', 'rate', 'warmup_epochs', 'seed', 'step', 'examples',
          'epochs', 'precision', 'wall_s', 'recipe']


def parse_args(argv):
  """Returns the command line's options."""
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--towers', type=int, default=1)
  p.add_argument('--trainer', default='cifar10_multi_gpu_train.py',
                 choices=['cifar10_multi_gpu_train.py', 'cifar10_train.py'])
  p.add_argument('--seed', type=int, default=1)
  p.add_argument('--learning_rate_scaling', default='none',
                 choices=['none', 'linear'])
  p.add_argument('--warmup_epochs', type=float, default=0.0)
  p.add_argument('--initial_learning_rate', type=float, default=None)
  p.add_argument('--target', type=float, default=0.80)
  p.add_argument('--max_epochs', type=float, default=100)
  p.add_argument('--give_up_below', type=float, default=0.70)
  p.add_argument('--give_up_epochs', type=float, default=50)
  p.add_argument('--data_dir', required=True)
  p.add_argument('--out_dir', required=True)
  p.add_argument('--recipe', default='',
                 help='the optimizer and schedule\'s trainer flags, written '
                 'to the CSV, e.g. "--optimizer=momentum --lr_schedule=cosine '
                 '--train_epochs=18"')
  p.add_argument('--held_out', action='store_true',
                 help='train without the last 5,000 training images '
                 '(--hold_out) and evaluate on them, not on the test set: '
                 'to choose among recipes')
  p.add_argument('--extra', default='',
                 help='more trainer flags, not written to the CSV, e.g. '
                 '"--use_bf16"')
  p.add_argument('--evaluator_on_cpu', action='store_true',
                 help='hide the GPUs from the evaluator, which then runs on '
                 'the CPU and leaves the GPU to the trainer (on one H100 '
                 'it could not start beside eight virtual GPUs: docs/gpu.md)')
  args = p.parse_args(argv)
  if args.trainer == 'cifar10_train.py' and args.towers != 1:
    p.error('cifar10_train.py trains one tower: leave --towers out.')
  budget = recipe_flags(args.recipe).get('train_epochs')
  if budget is not None:
    args.max_epochs = float(budget)
  return args


def commands(args):
  """Returns (trainer's command, evaluator's command), as argument lists."""
  examples_per_step = BATCH_SIZE * args.towers
  steps_per_epoch = EXAMPLES_PER_EPOCH / examples_per_step
  train_dir = os.path.join(args.out_dir, 'train')
  trainer = [sys.executable, os.path.join(ROOT, args.trainer),
             '--data_dir=' + args.data_dir, '--train_dir=' + train_dir,
             '--batch_size=%d' % BATCH_SIZE, '--seed=%d' % args.seed,
             '--max_steps=%d' % math.ceil(args.max_epochs * steps_per_epoch),
             '--save_checkpoint_steps=%d' % math.ceil(steps_per_epoch),
             '--log_frequency=100',
             '--learning_rate_scaling=' + args.learning_rate_scaling,
             '--warmup_epochs=%g' % args.warmup_epochs]
  if args.trainer == 'cifar10_multi_gpu_train.py':
    trainer += ['--num_gpus=%d' % args.towers, '--virtual_gpus']
  if args.initial_learning_rate is not None:
    trainer.append('--initial_learning_rate=%g' % args.initial_learning_rate)
  trainer += args.recipe.split() + args.extra.split()
  if args.held_out:
    trainer.append('--hold_out')
  evaluator = ['nice', '-n', str(NICE), sys.executable,
               os.path.join(ROOT, 'cifar10_eval.py'),
               '--data_dir=' + args.data_dir, '--checkpoint_dir=' + train_dir,
               '--eval_dir=' + os.path.join(args.out_dir, 'eval'),
               '--eval_interval_secs=%d' % POLL_SECS]
  if args.held_out:
    evaluator.append('--eval_data=held_out')
  return trainer, evaluator


def evaluator_environ(args):
  """Returns the evaluator's environment: this process's, with no GPU
  visible to it under --evaluator_on_cpu."""
  environ = dict(os.environ)
  if args.evaluator_on_cpu:
    environ['CUDA_VISIBLE_DEVICES'] = ''
  return environ


def evaluations(eval_dir):
  """Returns {global step: precision @ 1} from the evaluator's event files."""
  tag = event_files.PRECISION_TAG
  return {step: values[tag] for step, values in
          event_files.scalars(eval_dir, {tag}).items()}


def checkpoint_times(train_dir, seen):
  """Adds {step: the time its checkpoint was written} to seen; returns it."""
  for path in glob.glob(os.path.join(train_dir, 'model.ckpt-*.index')):
    step = int(re.search(r'ckpt-(\d+)\.index$', path).group(1))
    if step not in seen:
      seen[step] = os.path.getmtime(path)
  return seen


def outcome(args, curve):
  """Returns the line that ends the run, or None while it goes on."""
  if not curve:
    return None
  last = curve[-1]
  if math.isnan(float(last['precision'])):
    return 'diverged at step %s, %s epochs' % (last['step'], last['epochs'])
  best = max(curve, key=lambda r: float(r['precision']))
  for row in curve:
    if float(row['precision']) >= args.target:
      return ('reached %.1f%% at step %s: %s examples, %s epochs%s' % (
          100 * float(row['precision']), row['step'], row['examples'],
          row['epochs'], ', %.1f min' % (float(row['wall_s']) / 60)
          if row['wall_s'] else ''))
  if float(last['epochs']) >= args.max_epochs - 1e-6:
    return ('not reached in %g epochs (best %.1f%% at %s epochs)' % (
        args.max_epochs, 100 * float(best['precision']), best['epochs']))
  if (float(last['epochs']) >= args.give_up_epochs and
      float(best['precision']) < args.give_up_below):
    return ('given up: below %.0f%% at %s epochs (best %.1f%%)' % (
        100 * args.give_up_below, last['epochs'],
        100 * float(best['precision'])))
  return None


def read_curve(path):
  """Returns the rows already in the CSV at path, or []."""
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return list(csv.DictReader(f))


def append_rows(path, rows):
  """Appends rows to the CSV at path, with a header if it is new."""
  new = not os.path.exists(path)
  with open(path, 'a') as f:
    writer = csv.DictWriter(f, FIELDS)
    if new:
      writer.writeheader()
    writer.writerows(rows)


def new_rows(args, found, written, times, clock):
  """Returns CSV rows for the evaluations not yet in the CSV, in step order;
  clock: run_clock()'s."""
  rows = []
  for step in sorted(s for s in found if s not in written):
    seconds = clock(times[step]) if step in times else None
    wall = '' if seconds is None else '%.0f' % seconds
    rows.append(row(args, step, '%.4f' % found[step], wall))
  return rows


def run_clock(curve, earlier, start, part_starts=()):
  """Returns clock(t): the seconds the run has trained when a checkpoint is
  written at time t, counted from the run's first start. earlier: {step:
  write time} of the checkpoints already in its train_dir at this
  command's start; part_starts: the times earlier commands' trainers
  started (event_files.start_times of the train_dir). Resumed, the clock
  goes on from the last row with a wall_s and its checkpoint's time, and
  leaves out each time the run stood stopped: from the newest checkpoint
  before a start to that start (an earlier command killed before its last
  checkpoints were evaluated left a stop between them and that row).
  clock(t) is None when that row or its checkpoint is gone."""
  if not earlier:
    return lambda t: t - start
  timed = [r for r in curve if r['wall_s'] and int(r['step']) in earlier]
  if not timed:
    return lambda t: None
  since = earlier[int(timed[-1]['step'])]
  trained = float(timed[-1]['wall_s'])
  # Each start after the anchor's: the run stood stopped from the newest
  # checkpoint before it (or the start before it, if that part wrote none).
  stops, before = [], since
  for begun in sorted(set(part_starts) | {start}):
    if since < begun <= start:
      stopped = max([before] + [w for w in earlier.values() if w < begun])
      stops.append((stopped, begun))
      before = begun
  return lambda t: trained + t - since - sum(
      begun - stopped for stopped, begun in stops if begun <= t)


def row(args, step, precision, wall):
  """Returns the CSV row of the evaluation of step's checkpoint. Its rate
  and warm-up are those the trainer ran with: the --recipe's flags where
  it gives them."""
  examples = step * BATCH_SIZE * args.towers
  rate, warmup = rate_and_warmup(args.recipe, args.initial_learning_rate,
                                 args.learning_rate_scaling,
                                 args.warmup_epochs)
  return dict(towers=args.towers, rate=rate, warmup_epochs=warmup,
              seed=args.seed,
              step=step, examples=examples,
              epochs='%.2f' % (examples / EXAMPLES_PER_EPOCH),
              precision=precision, wall_s=wall, recipe=args.recipe)


def recipe_flags(recipe):
  """Returns {flag: value} of a --recipe's --flag=value pairs."""
  return dict(re.findall(r'--(\w+)=(\S+)', recipe))


def rate_and_warmup(recipe, initial, scaling, warmup):
  """Returns the CSV's rate and warmup_epochs cells of a run: the recipe's
  flags where it gives them, else initial (None: not given), scaling and
  warmup."""
  given = recipe_flags(recipe)
  initial = given.get('initial_learning_rate', initial)
  rate = ('%g' % float(initial) if initial is not None else
          given.get('learning_rate_scaling', scaling))
  return rate, '%g' % float(given.get('warmup_epochs', warmup))


def diverged_rows(args, log_path):
  """Returns [the row of precision nan at the step the trainer's loss
  diverged], from the trainer's Error line in the log, or []."""
  match = re.match(r'Error: Model diverged with loss = \S+ at step (\d+)',
                   last_error(log_path))
  return [row(args, int(match.group(1)), 'nan', '')] if match else []


def stop(process):
  """Stops a child with SIGTERM, which the trainer takes as it takes Ctrl-C
  (it saves a checkpoint), and waits for it. Not SIGINT: a script's
  background job (`nohup python docs/time_to_target.py ... &`) and its
  children ignore SIGINT."""
  if process.poll() is None:
    process.send_signal(signal.SIGTERM)
    try:
      process.wait(timeout=120)
    except subprocess.TimeoutExpired:
      process.kill()
      process.wait()


def run(args):
  """Trains and evaluates until the run ends; returns its last line."""
  os.makedirs(args.out_dir, exist_ok=True)
  csv_path = os.path.join(args.out_dir, 'curve.csv')
  curve = read_curve(csv_path)
  done = outcome(args, curve)
  if done:
    return done
  trainer_cmd, evaluator_cmd = commands(args)
  start = time.time()
  train_dir = os.path.join(args.out_dir, 'train')
  clock = run_clock(curve, checkpoint_times(train_dir, {}), start,
                    event_files.start_times(train_dir))
  # Each child its own log, so an Error line names whose it is.
  log = open(os.path.join(args.out_dir, 'log'), 'a')
  eval_log = open(os.path.join(args.out_dir, 'eval_log'), 'a')
  print(' '.join(trainer_cmd), file=log, flush=True)
  print(' '.join(evaluator_cmd), file=eval_log, flush=True)
  # Killed (SIGTERM) as when stopped by Ctrl-C: the children stop too,
  # rather than train on holding the directory's lock.
  signal.signal(signal.SIGTERM, signal.default_int_handler)
  trainer = subprocess.Popen(trainer_cmd, stdout=log, stderr=log)
  evaluator = subprocess.Popen(evaluator_cmd, stdout=eval_log,
                               stderr=eval_log, env=evaluator_environ(args))
  try:
    done = follow(args, trainer, evaluator, curve, csv_path, clock)
    evaluator_exit = evaluator.poll()  # Not None: it died and ended the run.
  finally:
    stop(trainer)
    stop(evaluator)
    log.close()
    eval_log.close()
  if not done:
    rows = diverged_rows(args, log.name)
    append_rows(csv_path, rows)
    done = outcome(args, curve + rows)
  if done:
    return done
  if evaluator_exit is not None:
    return ('evaluator ended (exit %s) before the run did, so the trainer was '
            'stopped (run the same command again to resume): %s' % (
                evaluator_exit, last_error(eval_log.name) or
                'its traceback is in ' + eval_log.name))
  return 'trainer ended (exit %s) before the run did: %s' % (
      trainer.returncode, last_error(log.name) or 'no Error line')


def follow(args, trainer, evaluator, curve, csv_path, clock):
  """Writes each new evaluation to the CSV until the run ends, the
  evaluator dies (no run ends without it), or the trainer has been gone two
  minutes; returns outcome()'s line or None."""
  times = {}
  trainer_done_at = None
  while True:
    time.sleep(POLL_SECS)
    checkpoint_times(os.path.join(args.out_dir, 'train'), times)
    found = evaluations(os.path.join(args.out_dir, 'eval'))
    rows = new_rows(args, found, {int(r['step']) for r in curve}, times,
                    clock)
    append_rows(csv_path, rows)
    curve += rows
    done = outcome(args, curve)
    if trainer.poll() is not None and trainer_done_at is None:
      trainer_done_at = time.time()
    if (done or evaluator.poll() is not None or
        (trainer_done_at and time.time() - trainer_done_at > 120)):
      return done


def last_error(log_path):
  """Returns the last 'Error: ' line of the log at log_path (a diverged
  trainer's names the step and the rate), or ''."""
  with open(log_path) as f:
    errors = [line.strip() for line in f if line.startswith('Error: ')]
  return errors[-1] if errors else ''


def main(argv):
  try:
    print(run(parse_args(argv)))
  except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the children stopped.
    sys.exit('Stopped before the run ended: run the same command again to '
             'resume it.')


if __name__ == '__main__':
  main(sys.argv[1:])
