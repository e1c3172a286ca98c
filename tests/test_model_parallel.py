"""cifar10_model_parallel_train.py: one model's layers on two devices, a
falling loss, and checkpoints the evaluator reads unchanged."""

import os

import numpy as np
import tensorflow as tf

import cifar10
import cifar10_model_parallel_train as model_parallel
from conftest import STEP_LINE, evaluate, run_script

tf1 = tf.compat.v1


def test_layers_and_their_variables_and_gradients_on_their_parts_device(
    fake_data_dir):
  devices = ['/device:CPU:0', '/device:CPU:1']
  with tf.Graph().as_default() as graph:
    with tf.device('/cpu:0'):
      batch = cifar10.distorted_inputs(fake_data_dir, 8)
    model_parallel.build_train_op([batch], ['/cpu:0', '/cpu:1'])
    # An op without a device (a variable's read) goes where its inputs
    # are; one colocated with another goes where that one goes.
    placed = {op.name: tf.DeviceSpec.from_string(op.device).to_string()
              for op in graph.get_operations()
              if op.device and
              op.colocation_groups() == [b'loc:@' + op.name.encode()]}
  first, second = model_parallel.PARTS
  for name, device in placed.items():
    if '/Initializer/' in name:
      continue  # Made in an init scope, outside every device function.
    layer = name.replace('gradients/', '', 1).split('/')[0]
    layer = layer[:-len('_grad')] if layer.endswith('_grad') else layer
    if layer in first:
      assert device == devices[0], (name, device)
    elif layer in second:
      assert device == devices[1], (name, device)
  # The heavy ops, forward and backward, and the variables.
  for name, part in [('conv2/Conv2D', 0), ('local3/MatMul', 1),
                     ('conv1/weights', 0), ('softmax_linear/weights', 1),
                     ('cross_entropy', 1)]:
    assert placed[name] == devices[part], name
  backprop = [name for name in placed if name.startswith('gradients/conv2/')
              and 'Conv2DBackprop' in name]
  assert backprop and {placed[n] for n in backprop} == {devices[0]}


def test_trains_with_falling_loss_and_evaluates(real_data_dir, tmp_path):
  train_dir = str(tmp_path / 'train')
  result = run_script('cifar10_model_parallel_train.py', '--virtual_gpus',
                      '--batch_size=32', '--max_steps=100', '--seed=1',
                      '--log_frequency=1', '--data_dir=' + real_data_dir,
                      '--train_dir=' + train_dir)
  assert result.returncode == 0, result.stderr[-3000:]
  assert ('running the 2 part(s) on the CPU, part i on virtual CPU device '
          '/cpu:i' in result.stdout)
  losses = [float(m.group(2)) for m in STEP_LINE.finditer(result.stdout)]
  # The mean loss of the first 10 steps against the last 10 (320 examples
  # each; one batch's loss swings by 0.1 and more): over seeds 1-10 it
  # fell by 0.39 to 0.53, at a learning rate of 0 by -0.006 to -0.004.
  assert len(losses) == 100
  assert np.mean(losses[:10]) - np.mean(losses[-10:]) > 0.2, losses
  evaluated = evaluate(real_data_dir, train_dir, tmp_path / 'eval',
                       '--num_examples=500')
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  assert 'precision @ 1 = ' in evaluated.stdout
  assert os.path.exists(os.path.join(train_dir, 'model.ckpt-100.index'))
