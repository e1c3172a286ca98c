"""docs/plot_precision.py: curves from eval event files and CSV, a PNG."""

import os
import subprocess
import sys

import tensorflow as tf

from conftest import REPO

tf1 = tf.compat.v1


def _write_eval_events(eval_dir, points):
  """Writes 'Precision @ 1' values as cifar10_eval.py does."""
  with tf.Graph().as_default():
    writer = tf1.summary.FileWriter(eval_dir)
    for step, precision in points:
      summary = tf1.Summary()
      summary.value.add(tag='Precision @ 1', simple_value=precision)
      writer.add_summary(summary, step)
    writer.close()


def test_plots_event_dir_and_csv_with_a_table(tmp_path):
  eval_dir = str(tmp_path / 'eval')
  _write_eval_events(eval_dir, [(0, 0.1), (1000, 0.625), (1500, 0.65),
                                (2000, 0.7)])
  csv_path = tmp_path / 'other.csv'
  csv_path.write_text('# a comment\n1000,0.6\n2000,0.71\n3000,0.75\n')
  out = str(tmp_path / 'curve.png')
  result = subprocess.run(
      [sys.executable, os.path.join(REPO, 'docs', 'plot_precision.py'),
       '--out=' + out, 'ours=' + eval_dir, 'theirs=' + str(csv_path)],
      capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.splitlines() == [
      '| step | ours | theirs |',
      '| ---: | ---: | ---: |',
      '| 1000 | 62.5% | 60.0% |',
      '| 2000 | 70.0% | 71.0% |',
      '| 3000 |  | 75.0% |',
      'Wrote %s.' % out]
  with open(out, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'


def test_missing_curve_is_a_usage_error(tmp_path):
  result = subprocess.run(
      [sys.executable, os.path.join(REPO, 'docs', 'plot_precision.py'),
       '--out=' + str(tmp_path / 'x.png'), 'ours=' + str(tmp_path / 'none')],
      capture_output=True, text=True, timeout=300)
  assert result.returncode == 2
  assert 'give LABEL=PATH' in result.stderr
  assert not (tmp_path / 'x.png').exists()
