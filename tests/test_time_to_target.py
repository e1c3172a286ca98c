"""docs/time_to_target.py: the commands it runs, how a run ends, its CSV,
and a whole (tiny) run with a resume."""

import csv
import glob
import math
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, script_env

sys.path.insert(0, os.path.join(REPO, 'docs'))
import time_to_target  # pylint: disable=g-import-not-at-top,wrong-import-position


def _args(*argv):
  return time_to_target.parse_args(
      ['--data_dir=D', '--out_dir=O'] + list(argv))


def _curve(*points, wall=''):
  """Rows as the CSV holds them, from (epochs, precision) pairs; four
  towers of 128, so an epoch is 50000 / 512 steps."""
  args = _args('--towers=4')
  return [time_to_target.row(args, round(epochs * 50000 / 512),
                             '%.4f' % precision, wall)
          for epochs, precision in points]


def test_commands_checkpoint_every_epoch_and_stop_at_max_epochs():
  trainer, evaluator = time_to_target.commands(_args(
      '--towers=4', '--seed=2', '--learning_rate_scaling=linear',
      '--warmup_epochs=5', '--initial_learning_rate=0.05'))
  # 50,000 / (4 x 128) = 97.66 steps an epoch.
  assert '--save_checkpoint_steps=98' in trainer
  assert '--max_steps=%d' % math.ceil(100 * 50000 / 512) in trainer
  for flag in ['--num_gpus=4', '--virtual_gpus', '--seed=2',
               '--learning_rate_scaling=linear', '--warmup_epochs=5',
               '--initial_learning_rate=0.05', '--train_dir=O/train']:
    assert flag in trainer
  assert trainer[1].endswith('cifar10_multi_gpu_train.py')
  assert evaluator[:3] == ['nice', '-n', str(time_to_target.NICE)]
  assert '--checkpoint_dir=O/train' in evaluator
  assert '--hold_out' not in trainer
  assert not any(a.startswith('--eval_data') for a in evaluator)
  one, _ = time_to_target.commands(_args('--trainer=cifar10_train.py'))
  assert one[1].endswith('cifar10_train.py')
  assert not any(a.startswith('--num_gpus') for a in one)


def test_evaluator_on_cpu_hides_the_gpus_from_the_evaluator_alone(
    monkeypatch):
  monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '0')
  assert time_to_target.evaluator_environ(_args())['CUDA_VISIBLE_DEVICES'] \
      == '0'
  on_cpu = time_to_target.evaluator_environ(_args('--evaluator_on_cpu'))
  assert on_cpu['CUDA_VISIBLE_DEVICES'] == ''
  assert on_cpu['PATH'] == os.environ['PATH']


def test_run_starts_the_evaluator_in_its_environment(monkeypatch, tmp_path):
  started = []

  class Child(object):
    returncode = 0

    def __init__(self, command, env=None, **unused_kwargs):
      started.append((command, env))

    def poll(self):
      return 0

  monkeypatch.setattr(time_to_target.subprocess, 'Popen', Child)
  monkeypatch.setattr(time_to_target, 'follow', lambda *unused: 'ended')
  args = time_to_target.parse_args(['--data_dir=D', '--out_dir=%s' % tmp_path,
                                    '--evaluator_on_cpu'])
  assert time_to_target.run(args) == 'ended'
  (trainer, trainer_env), (evaluator, evaluator_env) = started
  assert trainer[1].endswith('cifar10_multi_gpu_train.py') and not trainer_env
  assert any(part.endswith('cifar10_eval.py') for part in evaluator)
  assert evaluator_env['CUDA_VISIBLE_DEVICES'] == ''


def test_held_out_trains_without_the_held_out_images_and_evaluates_them():
  trainer, evaluator = time_to_target.commands(_args('--held_out'))
  assert '--hold_out' in trainer
  assert '--eval_data=held_out' in evaluator


def test_a_recipe_goes_to_the_trainer_and_the_csv_and_sets_the_end():
  recipe = ('--optimizer=lars --lars_trust_coefficient=0.3 '
            '--initial_learning_rate=0.005 --learning_rate_scaling=linear '
            '--warmup_epochs=2 --lr_schedule=cosine --train_epochs=50')
  args = _args('--towers=8', '--recipe=' + recipe, '--extra=--use_bf16')
  assert args.max_epochs == 50  # The budget ends the run.
  trainer, _ = time_to_target.commands(args)
  assert trainer[-8:] == recipe.split() + ['--use_bf16']
  row = time_to_target.row(args, 1617, '0.8010', '')
  # The rate and warm-up the trainer ran with, the recipe's flags whole.
  assert (row['rate'], row['warmup_epochs'], row['recipe']) == (
      '0.005', '2', recipe)
  assert time_to_target.FIELDS[-1] == 'recipe'
  # Without a recipe: the tutorial's columns, an empty recipe.
  plain = time_to_target.row(_args('--towers=4'), 98, '0.3', '')
  assert (plain['rate'], plain['warmup_epochs'], plain['recipe']) == (
      'none', '0', '')


def test_outcome_names_the_first_evaluation_at_the_target():
  args = _args('--towers=4')
  assert time_to_target.outcome(args, []) is None
  going = _curve((1, 0.40), (2, 0.55))
  assert time_to_target.outcome(args, going) is None
  # The first crossing counts, not the best evaluation after it.
  reached = _curve((70, 0.7990), (71, 0.8003), (72, 0.8100), wall='3000')
  assert time_to_target.outcome(args, reached) == (
      'reached 80.0% at step 6934: 3550208 examples, 71.00 epochs, 50.0 min')
  # Without a wall clock (a resumed run) the minutes are left out.
  assert time_to_target.outcome(args, _curve((71, 0.81))).endswith(
      '71.00 epochs')


def test_a_resumed_run_keeps_its_clock_without_the_time_it_stood_stopped():
  args = _args('--towers=4')
  # Its first command: started at 1000, checkpoints at 1100 (step 98) and
  # 1200 (step 195), stopped at 1230 with a checkpoint of step 225 that
  # was never evaluated; the run stood stopped until 5000.
  curve = _curve((1, 0.40), wall='100') + _curve((2, 0.55), wall='200')
  earlier = {98: 1100.0, 195: 1200.0, 225: 1230.0}
  clock = time_to_target.run_clock(curve, earlier, 5000.0)
  times = dict(earlier)
  times[293] = 5060.0
  rows = time_to_target.new_rows(
      args, {98: 0.4, 195: 0.55, 225: 0.6, 293: 0.65}, {98, 195}, times,
      clock)
  # Step 225's from the earlier clock; step 293's 60 s after the resume,
  # on top of the 230 s trained before it, not 4,060 s after step 0.
  assert [(r['step'], r['wall_s']) for r in rows] == [(225, '230'),
                                                      (293, '290')]
  # A first start counts from this command's start.
  fresh = time_to_target.run_clock([], {}, 5000.0)
  assert fresh(5060.0) == 60.0
  # The earlier clock lost (rows without wall_s, or their checkpoints
  # gone): blank, not a time from this command's start alone.
  assert time_to_target.run_clock(_curve((1, 0.4)), earlier, 5000.0)(
      5060.0) is None
  assert time_to_target.run_clock(curve, {225: 1230.0}, 5000.0)(
      5060.0) is None


def test_a_run_killed_twice_leaves_both_stops_out_of_its_clock(tmp_path):
  # Evaluated to step 195 (1200); stopped at 1230 (step 225); a second
  # command's trainer started at 3000, wrote step 293 at 3060 and was
  # killed before it was evaluated; a third started at 4000 and died
  # before any checkpoint; this command starts at 5000.
  curve = _curve((1, 0.40), wall='100') + _curve((2, 0.55), wall='200')
  earlier = {98: 1100.0, 195: 1200.0, 225: 1230.0, 293: 3060.0}
  train_dir = str(tmp_path)
  for name, began in (('a', 1000.5), ('b', 3000.0), ('c', 4000.0)):
    _event_file(os.path.join(train_dir, 'events.out.tfevents.' + name),
                began, began + 30)
  starts = time_to_target.event_files.start_times(train_dir)
  assert starts == [1000.5, 3000.0, 4000.0]  # First records, not the last.
  clock = time_to_target.run_clock(curve, earlier, 5000.0, starts)
  # 230 s before the first stop, 60 s in the second part, 60 s in this.
  assert [clock(earlier[225]), clock(earlier[293]), clock(5060.0)] == [
      230.0, 290.0, 350.0]
  # Without the starts, the second part's stop (1230 to 3000) is counted.
  assert time_to_target.run_clock(curve, earlier, 5000.0)(3060.0) == 2060.0


def _event_file(path, *wall_times):
  """Writes an event file of records stamped wall_times."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  with tf.io.TFRecordWriter(path) as writer:
    for wall_time in wall_times:
      writer.write(tf.compat.v1.Event(
          wall_time=wall_time, file_version='brain.Event:2')
                   .SerializeToString())


def test_outcome_at_max_epochs_give_up_and_divergence(tmp_path):
  args = _args('--towers=4')
  assert time_to_target.outcome(args, _curve((60, 0.786), (100, 0.781))) == (
      'not reached in 100 epochs (best 78.6% at 60.00 epochs)')
  # Below 70% at 50 epochs: given up; at 69.9% before 50, not yet.
  assert time_to_target.outcome(args, _curve((49, 0.699))) is None
  assert time_to_target.outcome(args, _curve((10, 0.60), (50, 0.65))) == (
      'given up: below 70% at 50.00 epochs (best 65.0%)')
  # A diverged trainer's Error line becomes a row of precision nan.
  log = tmp_path / 'log'
  log.write_text('step 300, loss = 2.1\nError: Model diverged with loss = '
                 'nan at step 317. The last good checkpoint, x, is kept.\n')
  rows = time_to_target.diverged_rows(args, str(log))
  assert [(r['step'], r['precision']) for r in rows] == [(317, 'nan')]
  assert time_to_target.outcome(args, _curve((3, 0.2)) + rows) == (
      'diverged at step 317, 3.25 epochs')
  log.write_text('step 300, loss = 2.1\n')
  assert time_to_target.diverged_rows(args, str(log)) == []


def test_a_tiny_run_ends_writes_its_curve_and_returns_at_once_when_rerun(
    fake_data_dir, tmp_path):
  out = tmp_path / 'run'
  command = [sys.executable, os.path.join(REPO, 'docs', 'time_to_target.py'),
             '--trainer=cifar10_train.py', '--data_dir=' + fake_data_dir,
             '--out_dir=%s' % out, '--max_epochs=0.02', '--seed=3']
  first = subprocess.run(command, capture_output=True, text=True,
                         timeout=300, env=script_env())
  assert first.returncode == 0, first.stderr[-3000:]
  # 0.02 epochs of 128 = 8 steps; the trainer's last checkpoint evaluated.
  assert first.stdout.startswith('not reached in 0.02 epochs (best '), (
      first.stdout, (out / 'log').read_text()[-3000:])
  with open(out / 'curve.csv') as f:
    rows = list(csv.DictReader(f))
  # The step-0 checkpoint is evaluated too when the evaluator sees it
  # before step 8's is written (a race the test does not control).
  assert [r['step'] for r in rows] in (['8'], ['0', '8']), rows
  assert [(r['towers'], r['rate'], r['seed'], r['step'], r['examples'],
           r['epochs']) for r in rows[-1:]] == [
               ('1', 'none', '3', '8', '1024', '0.02')]
  assert 0.0 <= float(rows[-1]['precision']) <= 1.0
  assert float(rows[-1]['wall_s']) > 0
  log_size = (out / 'log').stat().st_size
  again = subprocess.run(command, capture_output=True, text=True,
                         timeout=120, env=script_env())
  assert again.returncode == 0, again.stderr[-3000:]
  assert again.stdout == first.stdout
  # Nothing ran: the log is as it was.
  assert (out / 'log').stat().st_size == log_size


def test_parse_args_refuses_towers_for_the_one_tower_trainer(capsys):
  with pytest.raises(SystemExit) as exit_info:
    _args('--trainer=cifar10_train.py', '--towers=2')
  assert exit_info.value.code == 2
  assert 'cifar10_train.py trains one tower' in capsys.readouterr().err


def _ignore_sigint():
  signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_killed_it_stops_its_trainer_and_evaluator(fake_data_dir, tmp_path):
  out = tmp_path / 'killed'
  # Started as a script's background job is: SIGINT ignored, in it and in
  # the children it starts.
  process = subprocess.Popen(
      [sys.executable, os.path.join(REPO, 'docs', 'time_to_target.py'),
       '--trainer=cifar10_train.py', '--data_dir=' + fake_data_dir,
       '--out_dir=%s' % out, '--max_epochs=50', '--seed=3'],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      env=script_env(), preexec_fn=_ignore_sigint)
  # Wait for the trainer's first checkpoint: both children are running.
  deadline = time.time() + 240
  while not glob.glob(str(out / 'train' / 'model.ckpt-*.index')):
    assert process.poll() is None and time.time() < deadline, (
        (out / 'log').read_text()[-3000:] if (out / 'log').exists() else '')
    time.sleep(1)
  process.send_signal(signal.SIGTERM)
  # Within a minute: a child that ignored its stop signal would hold it for
  # the two minutes stop() waits before it kills.
  _, stderr = process.communicate(timeout=60)
  assert process.returncode == 1
  assert stderr.strip().splitlines()[-1] == (
      'Stopped before the run ended: run the same command again to resume '
      'it.')
  # No process still names the run's directories: none trains on.
  left = subprocess.run(['pgrep', '-f', str(out)], capture_output=True,
                        text=True)
  assert left.stdout.strip() == '', left.stdout


def test_an_evaluator_that_dies_ends_the_run_and_stops_its_trainer(
    fake_data_dir, tmp_path):
  """On one H100 the evaluator beside eight virtual GPUs died at its first
  evaluation and the trainer trained on, unevaluated, to its last step
  (docs/gpu.md). Here the evaluator dies at its start (no test images):
  the run ends within a minute or so, not 50 epochs later, and says why."""
  os.remove(os.path.join(fake_data_dir, 'cifar-10-batches-bin',
                         'test_batch.bin'))
  out = tmp_path / 'no_evaluator'
  ended = subprocess.run(
      [sys.executable, os.path.join(REPO, 'docs', 'time_to_target.py'),
       '--trainer=cifar10_train.py', '--data_dir=' + fake_data_dir,
       '--out_dir=%s' % out, '--max_epochs=50', '--seed=3'],
      capture_output=True, text=True, timeout=240, env=script_env())
  assert ended.returncode == 0, ended.stderr[-3000:]
  assert ended.stdout.startswith(
      'evaluator ended (exit 1) before the run did, so the trainer was '
      'stopped (run the same command again to resume): Error: Failed to '
      'find file: '), ended.stdout
  assert 'test_batch.bin' in ended.stdout
  # The line is the evaluator's own, from its log; the trainer's has none.
  assert 'test_batch.bin' in (out / 'eval_log').read_text()
  assert 'test_batch.bin' not in (out / 'log').read_text()
  left = subprocess.run(['pgrep', '-f', str(out)], capture_output=True,
                        text=True)
  assert left.stdout.strip() == '', left.stdout
