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
