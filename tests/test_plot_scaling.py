"""docs/plot_scaling.py: the precision table from a runs CSV, the speed
model's predictions, a PNG."""

import os
import subprocess
import sys

import pytest

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, 'docs'))
import plot_scaling  # pylint: disable=g-import-not-at-top,wrong-import-position


def test_table_of_runs_and_picture(tmp_path):
  runs = tmp_path / 'runs.csv'
  runs.write_text('# a comment\ntowers,scaling,seed,steps,ema,raw\n'
                  '1,none,1,3906,0.739,0.715\n1,none,2,3906,0.731,0.70\n'
                  '8,linear,1,488,0.30,0.28\n8,linear,2,488,0.35,\n'
                  '8,none,1,488,0.47,0.42\n')
  out = tmp_path / 'scaling.png'
  result = subprocess.run(
      [sys.executable, os.path.join(REPO, 'docs', 'plot_scaling.py'),
       '--runs=%s' % runs, '--out=%s' % out],
      capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stdout.splitlines()
  assert '| 1 | none | 2 | 73.1..73.9% | 70.0..71.5% |' in lines
  assert '| 8 | linear | 2 | 30.0..35.0% | 28.0..28.0% |' in lines
  # Row by row by towers, the unscaled rate before the linear rule.
  rows = [line.split(' | ')[:2] for line in lines
          if line[:4] in ('| 1 ', '| 8 ')]
  assert rows[:3] == [['| 1', 'none'], ['| 8', 'none'], ['| 8', 'linear']]
  assert out.stat().st_size > 10000
  assert out.read_bytes()[:4] == b'\x89PNG'


@pytest.mark.parametrize('tower_ms', plot_scaling.TOWER_MS)
def test_model_gains_less_than_the_towers_and_never_beyond_the_input(
    tower_ms):
  one = plot_scaling.examples_per_sec(1, tower_ms, plot_scaling.PCIE_GB_S)
  # One tower, replicated: nothing to all-reduce, the tower's own rate.
  assert plot_scaling.examples_per_sec(
      1, tower_ms, plot_scaling.PCIE_GB_S, replicated=True) == pytest.approx(
          min(128000 / tower_ms, 8 * plot_scaling.INPUT_PER_CORE))
  for towers in (2, 4, 8):
    ps = plot_scaling.examples_per_sec(towers, tower_ms,
                                       plot_scaling.PCIE_GB_S)
    ring = plot_scaling.examples_per_sec(towers, tower_ms,
                                         plot_scaling.PCIE_GB_S, True)
    nvlink = plot_scaling.examples_per_sec(towers, tower_ms,
                                           plot_scaling.NVLINK_GB_S, True)
    assert one < ps < towers * one
    assert ps <= ring <= nvlink <= 8 * plot_scaling.INPUT_PER_CORE
    # Two cores make 25,000 examples/sec: no more, however fast the GPUs.
    assert plot_scaling.examples_per_sec(
        towers, tower_ms, plot_scaling.PCIE_GB_S, cores=2) <= 25000
  # Over a network, one ps task's step grows with the machines, an
  # all-reduce's hardly.
  ps = [plot_scaling.machines_step_ms(m, tower_ms, False) for m in (2, 16)]
  ring = [plot_scaling.machines_step_ms(m, tower_ms, True) for m in (2, 16)]
  assert ps[1] - ps[0] > 10 * (ring[1] - ring[0])


CURVES = """towers,rate,warmup_epochs,seed,step,examples,epochs,precision,wall_s
4,none,0,1,98,50176,1.00,0.40,30
4,none,0,1,196,100352,2.01,0.79,61
4,none,0,1,294,150528,3.01,0.81,90
4,none,0,2,98,50176,1.00,0.81,33
8,linear,2,1,49,50176,1.00,0.30,
8,linear,2,1,4883,5000192,100.00,0.79,
8,0.05,5,1,2450,2508800,50.18,0.65,
8,linear,5,1,98,100352,2.01,0.31,
8,linear,5,1,156,159744,3.19,nan,
"""


def test_time_to_target_tables_and_picture(tmp_path):
  curves = tmp_path / 'curves.csv'
  curves.write_text(CURVES)
  cpu = tmp_path / 'cpu.csv'
  cpu.write_text(CURVES.splitlines()[0] + '\n1,none,0,1,14000,1792000,'
                 '35.84,0.80,1500\n1,none,0,2,14000,1792000,35.84,0.79,'
                 '1500\n')
  out = tmp_path / 'time.png'
  result = subprocess.run(
      [sys.executable, os.path.join(REPO, 'docs', 'plot_scaling.py'),
       '--runs=%s' % os.path.join(REPO, 'docs', 'scaling_precision.csv'),
       '--out=%s' % (tmp_path / 'scaling.png'), '--curves=%s' % curves,
       '--cpu_runs=%s' % cpu, '--out_time=%s' % out],
      capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stdout.splitlines()
  # Each seed's first evaluation at 80% or more: seed 1 at step 294, seed
  # 2 at 98; a run that never reached it says how it ended.
  assert ('| 4 | rate 0.1 unscaled | 2 | 98..294 | 0.05..0.15 | 1.0..3.0 | '
          'seed 1 reached; seed 2 reached |') in lines
  assert ('| 8 | linear rule (0.8), 2-epoch warm-up | 1 | - | - | - | seed 1 '
          'not reached in 100 epochs (best 79.0%) |') in lines
  # One tower of cifar10_train.py leads the table; where one run reached
  # 80%, its figures stand alone (no "14000..14000").
  header = lines.index('| ---: | --- | ---: | --- | --- | --- | --- |')
  assert lines[header + 1] == (
      '| 1, cifar10_train.py | rate 0.1 unscaled | 2 | 14000 | 1.79 | 35.8 | '
      'seed 1 reached; seed 2 stopped at 36 epochs (best 79.0%) |')
  assert ('| 8 | linear rule from 0.05 (0.4), 5-epoch warm-up | 1 | - | - | '
          '- | seed 1 stopped at 50 epochs, below 70% |') in lines
  # A last precision of nan: the loss diverged at that step.
  assert ('| 8 | linear rule (0.8), 5-epoch warm-up | 1 | - | - | - | seed 1 '
          'diverged at 3.2 epochs (best 31.0%) |') in lines
  # Minutes by the model: the mean examples (100,352) over the predicted
  # examples/sec; only configurations whose every run reached 80%.
  expected = 100352 / plot_scaling.examples_per_sec(
      4, 3.0, plot_scaling.PCIE_GB_S) / 60
  row = [l for l in lines if l.startswith('| 4 | rate 0.1 unscaled | 0.10 '
                                          '| 3 |')]
  assert len(row) == 1 and row[0].split(' | ')[4] == '%.1f' % expected
  assert not [l for l in lines if l.startswith('| 8 | linear')
              and '| 3 |' in l]
  assert 'This CPU, cifar10_train.py to 80%: 25.0 minutes' in lines
  assert out.read_bytes()[:4] == b'\x89PNG' and out.stat().st_size > 10000
