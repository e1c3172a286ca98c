"""docs/recipes.py: the runs put together, the S(B) fit, the recipes'
names and the predicted minutes."""

import csv
import os
import sys

import pytest

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, 'docs'))
import plot_scaling  # pylint: disable=g-import-not-at-top,wrong-import-position
import recipes  # pylint: disable=g-import-not-at-top,wrong-import-position

LARS = ('--optimizer=lars --lars_trust_coefficient=0.3 --nesterov '
        '--lr_schedule=cosine --initial_learning_rate=0.005 '
        '--learning_rate_scaling=linear --warmup_epochs=2 --train_epochs=50')


def test_fit_recovers_s_min_and_b_crit():
  # S(B) = 700 (1 + 1300 / B) at four batches, exactly.
  points = [(b, 700.0 * (1 + 1300.0 / b)) for b in (128, 256, 512, 1024)]
  s_min, b_crit = recipes.fit(points)
  assert s_min == pytest.approx(700.0)
  assert b_crit == pytest.approx(1300.0)


def test_label_names_optimizer_schedule_budget_and_the_scaled_peak():
  assert recipes.label(LARS, 8) == (
      'LARS 0.3 (Nesterov), cosine 50 ep, warm-up 2, peak 0.04')
  assert recipes.label('--optimizer=momentum --lr_schedule=linear '
                       '--initial_learning_rate=0.04 --train_epochs=18',
                       1) == 'momentum, linear 18 ep, peak 0.04'
  assert recipes.label('--optimizer=momentum --momentum=0.95 --nesterov '
                       '--lr_schedule=linear --initial_learning_rate=0.02 '
                       '--train_epochs=18', 1) == (
                           'momentum 0.95 (Nesterov), linear 18 ep, peak 0.02')
  assert recipes.label('--optimizer=lars --lars_trust_coefficient=0.3 '
                       '--momentum=0.8', 1).startswith('LARS 0.3, momentum 0.8,')
  assert recipes.label('', 4) == "the tutorial's SGD"
  assert recipes.label('--optimizer=momentum --nesterov --lr_schedule=linear '
                       '--initial_learning_rate=0.04 --train_epochs=80 '
                       '--label_smoothing=0.1 --conv_weight_decay=0.002 '
                       '--moving_average_decay=0.999', 1) == (
                           'momentum (Nesterov), linear 80 ep, peak 0.04, '
                           'smoothing 0.1, conv decay 0.002, averages 0.999')
  assert recipes.label('--optimizer=momentum --lr_schedule=linear '
                       '--train_epochs=8 --dropout=0.3', 1) == (
                           'momentum, linear 8 ep, peak 0.1, dropout 0.3')
  assert recipes.label('--optimizer=momentum --lr_schedule=linear '
                       '--train_epochs=8 --cutout=12', 1) == (
                           'momentum, linear 8 ep, peak 0.1, cutout 12')
  # The fully connected layers' decay is the tutorial's 0.004 untold, so
  # 0 is named too.
  assert recipes.label('--optimizer=momentum --lr_schedule=linear '
                       '--train_epochs=8 --fc_weight_decay=0', 1) == (
                           'momentum, linear 8 ep, peak 0.1, fc decay 0')


def _write(path, rows):
  with open(path, 'w') as f:
    writer = csv.DictWriter(f, recipes.FIELDS)
    writer.writeheader()
    writer.writerows(rows)


def _row(step, precision, seed=1, rate='none', warmup='0'):
  return dict(towers=8, rate=rate, warmup_epochs=warmup, seed=seed,
              step=step, examples=step * 1024, epochs='%.2f' % (
                  step * 1024 / 50000.0), precision=precision, wall_s='',
              recipe=LARS)


def test_collect_takes_rate_and_warmup_from_the_recipe(tmp_path):
  # An older run's rows said 'none' and 0 whatever its recipe gave.
  _write(tmp_path / 'a.csv', [_row(49, 0.41), _row(1617, 0.8006)])
  _write(tmp_path / 'b.csv', [_row(49, 0.40, seed=2, rate='0.005',
                                   warmup='2')])
  out = tmp_path / 'all.csv'
  recipes.collect([str(tmp_path / 'a.csv'), str(tmp_path / 'b.csv')],
                  str(out))
  with open(out) as f:
    rows = list(csv.DictReader(f))
  assert [(r['seed'], r['step'], r['rate'], r['warmup_epochs'])
          for r in rows] == [('1', '49', '0.005', '2'),
                             ('1', '1617', '0.005', '2'),
                             ('2', '49', '0.005', '2')]


def test_best_steps_needs_every_seed_at_the_target(tmp_path):
  _write(tmp_path / 'all.csv', [
      _row(1568, 0.797), _row(1617, 0.8006),
      _row(1617, 0.795, seed=2), _row(1715, 0.801, seed=2)])
  runs = recipes.read_recipes(str(tmp_path / 'all.csv'))
  # Each seed's crossing, interpolated, then their mean.
  steps, config = recipes.best_steps(runs)[8]
  assert config == LARS
  assert 1568 < steps < 1715
  # The tutorial's SGD (no recipe) beside them is no recipe's point.
  sgd = _row(1000, 0.81)
  sgd['recipe'] = ''
  _write(tmp_path / 'with_sgd.csv', [sgd, _row(1617, 0.8006)])
  assert recipes.best_steps(recipes.read_recipes(
      str(tmp_path / 'with_sgd.csv')))[8][1] == LARS
  _write(tmp_path / 'short.csv', [_row(1617, 0.8006),
                                  _row(1715, 0.799, seed=2)])
  assert recipes.best_steps(recipes.read_recipes(
      str(tmp_path / 'short.csv'))) == {}


def test_best_steps_takes_the_recipe_with_more_seeds(tmp_path):
  # One seed of a longer budget crosses sooner than a two-seed recipe's
  # mean; the two-seed mean is the point, not the one lucky seed.
  lucky = _row(1000, 0.801)
  lucky['recipe'] = LARS.replace('--train_epochs=50', '--train_epochs=120')
  _write(tmp_path / 'mixed.csv', [
      lucky, _row(1617, 0.8006), _row(1715, 0.801, seed=2)])
  steps, config = recipes.best_steps(recipes.read_recipes(
      str(tmp_path / 'mixed.csv')))[8]
  assert config == LARS
  assert steps > 1568


def test_minutes_are_the_step_cost_models(capsys):
  recipes.print_minutes({8: (1617, LARS)}, {1: 14076})
  lines = capsys.readouterr().out.splitlines()
  assert lines[0].startswith('| GPUs | optimizer | steps to 80% | 3 ms, PCIe')
  one, eight = lines[2].split(' | '), lines[3].split(' | ')
  assert one[1:3] == ["the tutorial's SGD", '14076']
  assert eight[1] == 'LARS 0.3 (Nesterov), cosine 50 ep, warm-up 2, peak 0.04'
  assert float(eight[3]) == pytest.approx(plot_scaling.predicted_minutes(
      1617 * 128 * 8, 8, 3.0, plot_scaling.PCIE_GB_S, False), abs=0.05)


def test_targets_table_and_a_fit_at_each_target(tmp_path, capsys):
  # One tower reaches 0.80 at step 1000 and 0.83 at 4000; eight towers
  # reach 0.80 at 200 and never 0.83.
  rows = []
  for towers, points in ((1, [(1000, 0.80), (4000, 0.83)]),
                         (8, [(200, 0.80), (900, 0.82)])):
    for step, precision in points:
      row = _row(step, precision)
      row.update(towers=towers, examples=step * 128 * towers,
                 recipe=LARS if towers == 8 else '--optimizer=momentum')
      rows.append(row)
  _write(tmp_path / 'runs.csv', rows)
  runs = recipes.read_recipes(str(tmp_path / 'runs.csv'))
  recipes.print_targets(runs, [0.80, 0.83])
  out = capsys.readouterr().out
  assert '| 1 | momentum, tutorial - ep, peak 0.1 | 1 | 1000 (0.13) | ' \
         '4000 (0.51) | 83.0% | - |' in out
  assert '| 8 | %s | 1 | 200 (0.20) | - | 82.0%% | - |' % recipes.label(
      LARS, 8) in out
  s_min, b_crit = recipes.fit([(128, 1000), (1024, 200)])
  assert '80%%: S_min %.0f steps, B_crit %.0f examples (towers 1, 8)' % (
      s_min, b_crit) in out
  assert '83%: reached by 1 tower(s) only: no fit' in out


def test_targets_table_gives_the_precision_at_the_end_of_the_budget(
    tmp_path, capsys):
  # LARS's budget is 50 epochs: 2,442 steps of 1,024. Seed 1 runs to its
  # end, past its best; seed 2 stops at 0.83, before it.
  end = int(50 * 50000 / 1024) + 1
  rows = [_row(500, 0.80), _row(1500, 0.836), _row(end, 0.834),
          _row(500, 0.81, seed=2), _row(1400, 0.83, seed=2)]
  _write(tmp_path / 'runs.csv', rows)
  recipes.print_targets(recipes.read_recipes(str(tmp_path / 'runs.csv')),
                        [0.83])
  out = capsys.readouterr().out
  assert '| 1450 (1.48) | 83.6% | 83.4% (50 ep) |' in out
  # With neither seed at its end, no precision at the end.
  _write(tmp_path / 'runs.csv', rows[:2] + rows[3:])
  recipes.print_targets(recipes.read_recipes(str(tmp_path / 'runs.csv')),
                        [0.83])
  assert '| 1450 (1.48) | 83.6% | - |' in capsys.readouterr().out


def test_recipes_table_says_when_not_every_seed_reached(tmp_path, capsys):
  _write(tmp_path / 'all.csv', [_row(1617, 0.8006), _row(1617, 0.795, seed=2),
                                _row(1715, 0.799, seed=2)])
  recipes.print_recipes(recipes.read_recipes(str(tmp_path / 'all.csv')))
  row = capsys.readouterr().out.splitlines()[2].split(' | ')
  assert row[2:4] == ['2', '1617 (1 of 2 seeds)']
  assert row[-1] == 'seed 1 80.1% (33.1); seed 2 79.9% (35.1) |'
  _write(tmp_path / 'both.csv', [_row(1617, 0.8006),
                                 _row(1715, 0.801, seed=2)])
  recipes.print_recipes(recipes.read_recipes(str(tmp_path / 'both.csv')))
  assert capsys.readouterr().out.splitlines()[2].split(' | ')[3] == \
      '1617..1715'


def test_reached_steps_prefers_the_recipe_every_seed_took_there(tmp_path):
  # Recipe A: both seeds at 0.83 (steps 5000, 5400); recipe B sooner but
  # in one seed of two; the tutorial's SGD (no recipe) sooner still.
  other = LARS.replace('--train_epochs=50', '--train_epochs=180')
  rows = [_row(5000, 0.83), _row(5400, 0.831, seed=2),
          _row(3000, 0.83), _row(3000, 0.82, seed=2)]
  for row in rows[2:]:
    row['recipe'] = other
  sgd = [_row(1000, 0.90), _row(1000, 0.90, seed=2)]
  for row in sgd:
    row['recipe'] = ''
  _write(tmp_path / 'all.csv', rows + sgd)
  runs = recipes.read_recipes(str(tmp_path / 'all.csv'))
  assert recipes.reached_steps(runs, 0.83) == {8: ([5000, 5400], 2)}
  # With A gone, B's one seed is what there is, and says so.
  _write(tmp_path / 'b.csv', rows[2:])
  assert recipes.reached_steps(recipes.read_recipes(
      str(tmp_path / 'b.csv')), 0.83) == {8: ([3000], 2)}
  assert recipes.reached_steps(runs, 0.84) == {}


def test_the_picture_fills_a_point_only_when_every_seed_of_two_got_there():
  assert recipes.seeds_note(2, 2) is None
  assert recipes.seeds_note(1, 2) == '1 of 2 seeds'
  assert recipes.seeds_note(1, 1) == 'one seed so far'


def test_first_step_at_reads_the_long_runs_csv(tmp_path):
  path = tmp_path / 'long.csv'
  path.write_text('# a comment, step,precision\n0,0.09\n1000,0.79\n'
                  '2000,0.8301\n3000,0.84\n')
  assert recipes.first_step_at(str(path), 0.83) == 2000
  assert recipes.first_step_at(str(path), 0.85) is None


def test_answer_picture_draws_both_targets(tmp_path):
  rows = [_row(1500, 0.80), _row(5000, 0.83), _row(1600, 0.80, seed=2),
          _row(5400, 0.83, seed=2)]
  _write(tmp_path / 'all.csv', rows)
  out = tmp_path / 'answer.png'
  found = recipes.plot_answer(recipes.read_recipes(str(tmp_path / 'all.csv')),
                              {0.80: 14076, 0.83: 72000}, str(out))
  assert found == {0.80: {8: ([1500, 1600], 2)},
                   0.83: {8: ([5000, 5400], 2)}}
  assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_ceiling_draws_each_run_to_its_end_and_the_sgd_in_epochs(tmp_path):
  cutout = dict(_row(120, 0.85), recipe=LARS + ' --cutout=8')
  _write(tmp_path / 'ceiling.csv', [_row(100, 0.70), _row(200, 0.84),
                                    _row(150, 0.80, seed=2), cutout])
  sgd = tmp_path / 'sgd.csv'
  sgd.write_text('# step,precision\n1000,0.5\n50000,0.83\n')
  out = tmp_path / 'ceiling.png'
  ends = recipes.plot_ceiling(recipes.read_recipes(str(tmp_path /
                                                       'ceiling.csv')),
                              str(sgd), str(out))
  # Each run's last evaluation, its epochs from its examples: a seed run
  # with two recipes (here with and without Cutout) keeps both ends.
  name = recipes.label(LARS, 8)
  assert ends == {(8, 1, name): (pytest.approx(200 * 1024 / 50000.0,
                                               abs=0.01), 0.84),
                  (8, 2, name): (pytest.approx(150 * 1024 / 50000.0,
                                               abs=0.01), 0.80),
                  (8, 1, name + ', cutout 8'): (
                      pytest.approx(120 * 1024 / 50000.0, abs=0.01), 0.85)}
  assert recipes.sgd_curve(str(sgd)) == [(1000 * 128 / 50000, 0.5),
                                         (50000 * 128 / 50000, 0.83)]
  assert out.stat().st_size > 10000


def test_targets_picture_fits_each_target_through_every_tower_count(
    tmp_path):
  # Each number of towers reaches 0.80 and 0.83 on S(B) curves exactly;
  # eight towers never reach 0.84, one tower alone does: no fit there.
  curves = {0.80: (700.0, 1300.0), 0.83: (1000.0, 2000.0)}
  rows = []
  for towers in (1, 2, 4, 8):
    for target, (s_min, b_crit) in sorted(curves.items()):
      step = int(round(s_min * (1 + b_crit / (128.0 * towers))))
      rows.append(dict(_row(step, target), towers=towers,
                       examples=step * 128 * towers))
  rows.append(dict(_row(90000, 0.84), towers=1, examples=90000 * 128))
  _write(tmp_path / 'all.csv', rows)
  out = tmp_path / 'near_the_top.png'
  fits = recipes.plot_targets(
      recipes.read_recipes(str(tmp_path / 'all.csv')), [0.80, 0.83, 0.84],
      [(0.83, 1092.0), (0.83, 1846.0)], str(out))
  assert sorted(fits) == [0.80, 0.83]
  for target, (s_min, b_crit) in curves.items():
    assert fits[target] == (pytest.approx(s_min, rel=0.01),
                            pytest.approx(b_crit, rel=0.01))
  assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_b_simple_takes_target_equals_examples():
  assert recipes.b_simple_arg('0.83=1092') == (0.83, 1092.0)
  with pytest.raises(recipes.argparse.ArgumentTypeError, match='TARGET='):
    recipes.b_simple_arg('0.83')


def test_recipe_contains_fits_one_family_only(tmp_path, monkeypatch, capsys):
  # One tower's faster recipe (decay 0.002) would be its fewest steps;
  # --recipe_contains keeps the 0.0005 family's one-tower run in the fit.
  light, heavy = LARS + ' --conv_weight_decay=0.0005', LARS + (
      ' --conv_weight_decay=0.002')
  rows = []
  for towers, step, recipe in ((1, 2000, light), (1, 1000, heavy),
                               (8, 300, light)):
    rows.append(dict(_row(step, 0.80), towers=towers, recipe=recipe,
                     examples=step * 128 * towers))
  _write(tmp_path / 'all.csv', rows)
  argv = ['recipes.py', '--curves=%s' % (tmp_path / 'all.csv'),
          '--targets=0.8']
  monkeypatch.setattr(sys, 'argv', argv + [
      '--recipe_contains=--conv_weight_decay=0.0005'])
  recipes.main()
  out = capsys.readouterr().out
  s_min, b_crit = recipes.fit([(128, 2000), (1024, 300)])
  assert '80%%: S_min %.0f steps, B_crit %.0f examples (towers 1, 8)' % (
      s_min, b_crit) in out
  assert 'conv decay 0.002' not in out
  monkeypatch.setattr(sys, 'argv', argv + ['--recipe_contains=sgd'])
  with pytest.raises(SystemExit, match="Error: no run .* contains 'sgd'"):
    recipes.main()
