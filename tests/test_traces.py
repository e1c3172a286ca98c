"""--trace_steps (machinery/step_hooks.py) and docs/plot_timeline.py: a
trace of each listed step, and nothing else; a picture of one."""

import glob
import json
import os
import subprocess
import sys

import tensorflow as tf

from conftest import REPO, run_script


def _run_metadata_tags(train_dir):
  """{tag: step} of the run metadata in train_dir's event files."""
  tags = {}
  for path in glob.glob(os.path.join(train_dir, 'events.out.tfevents.*')):
    for event in tf.compat.v1.train.summary_iterator(path):
      if event.HasField('tagged_run_metadata'):
        tags[event.tagged_run_metadata.tag] = event.step
  return tags


def _devices_of_convs(trace):
  """{device: the towers whose convolutions ran there} of a Chrome trace."""
  with open(trace) as f:
    events = json.load(f)['traceEvents']
  lanes = {e['pid']: e['args']['name'] for e in events
           if e.get('ph') == 'M' and e.get('name') == 'process_name'}
  devices = {}
  for e in events:
    # Conv2D, _FusedConv2D, _MklNativeConv2DBackpropFilter, ...
    if e.get('ph') == 'X' and 'Conv2D' in e['name']:
      device = lanes[e['pid']].split('device:')[-1].split()[0]
      tower = e['args']['name'].split('/')[0]
      devices.setdefault(device, set()).add(tower)
  return devices


def test_listed_steps_are_traced_and_no_others(fake_data_dir, tmp_path):
  train_dir = str(tmp_path / 'train')
  common = ['--num_gpus=2', '--virtual_gpus', '--batch_size=8',
            '--data_dir=' + fake_data_dir, '--train_dir=' + train_dir]
  # Without --trace_steps, no trace and no run metadata.
  plain = run_script('cifar10_multi_gpu_train.py', '--max_steps=2', *common)
  assert plain.returncode == 0, plain.stderr[-3000:]
  assert not glob.glob(os.path.join(train_dir, 'trace-step-*'))
  assert not _run_metadata_tags(train_dir)

  traced = run_script('cifar10_multi_gpu_train.py', '--max_steps=8',
                      '--trace_steps=3,5,20', *common)
  assert traced.returncode == 0, traced.stderr[-3000:]
  assert sorted(os.path.basename(p) for p in glob.glob(
      os.path.join(train_dir, 'trace-step-*'))) == [
          'trace-step-3.json', 'trace-step-5.json']
  for step in (3, 5):
    assert ('Step %d traced: %s/trace-step-%d.json (chrome://tracing, '
            'ui.perfetto.dev); its run metadata is run "step_%d" in '
            'TensorBoard\'s Graphs tab.' % (step, train_dir, step, step)
            in traced.stdout.splitlines())
    # Each tower's convolutions ran on its own device.
    assert _devices_of_convs(os.path.join(
        train_dir, 'trace-step-%d.json' % step)) == {
            'CPU:0': {'tower_0'}, 'CPU:1': {'tower_1'}}
  assert _run_metadata_tags(train_dir) == {'step_3': 3, 'step_5': 5}


def test_plot_draws_a_recorded_step(fake_data_dir, tmp_path):
  train_dir = str(tmp_path / 'train')
  result = run_script('cifar10_multi_gpu_train.py', '--num_gpus=2',
                      '--virtual_gpus', '--batch_size=8', '--max_steps=3',
                      '--trace_steps=2', '--data_dir=' + fake_data_dir,
                      '--train_dir=' + train_dir)
  assert result.returncode == 0, result.stderr[-3000:]
  picture = str(tmp_path / 'step.png')
  plotted = subprocess.run(
      [sys.executable, os.path.join(REPO, 'docs', 'plot_timeline.py'),
       os.path.join(train_dir, 'trace-step-2.json'), '--out=' + picture],
      capture_output=True, text=True, timeout=300)
  assert plotted.returncode == 0, plotted.stderr[-3000:]
  with open(picture, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  lines = plotted.stdout.splitlines()
  assert lines[1] == ('| part | CPU:0 (ms) | CPU:1 (ms) | share of the op '
                      'time |')
  parts = [line.split(' | ')[0][2:] for line in lines[3:-1]]
  # Both towers' passes, and the average that only the CPU of the
  # variables computes.
  assert {'forward', 'backward', 'averaging'} <= set(parts), lines
  averaging = [line for line in lines if line.startswith('| averaging |')]
  cpu0, cpu1 = (float(x) for x in averaging[0].split(' | ')[1:3])
  assert cpu0 > 0 and cpu1 == 0
