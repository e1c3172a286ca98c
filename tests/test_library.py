"""The model as a library: its functions run on their values, with no flag
read, in a process whose command line the flags do not know (a notebook
kernel's); and no flag's default depends on what a process imported."""

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO, script_env, script_graph, train

# A notebook: Jupyter's kernel runs with '-f <connection file>', which no
# flag of ours knows; reading a flag would parse it and fail
# (UnrecognizedFlagError: Unknown command line flag 'f').
NOTEBOOK = """
import json, sys
sys.argv = ['ipykernel_launcher.py', '-f', '/tmp/kernel-1234.json']
sys.path.insert(0, %r)
import numpy as np
import tensorflow as tf
import cifar10
import cifar10_eval
import cifar10_model_parallel_train as model_parallel
import cifar10_multi_gpu_train as multi
import cifar10_replicated
import cifar10_train
from machinery import hardware, options, recipe
tf1 = tf.compat.v1
data_dir, ops_file = %r, %r

with tf.Graph().as_default():
  # The tutorial's model on the data: a few steps, and the evaluation.
  images, labels = cifar10.distorted_inputs(data_dir, batch_size=8)
  loss = cifar10.loss(cifar10.inference(images), labels)
  train_op = cifar10.train(loss, tf1.train.get_or_create_global_step(), 8)
  with tf1.variable_scope(tf1.get_variable_scope(), reuse=True):
    correct = cifar10_eval.correct_predictions(True, data_dir, batch_size=8)
  with tf1.Session() as sess:
    sess.run([tf1.global_variables_initializer(),
              tf1.local_variables_initializer()])
    losses = [sess.run([train_op, loss])[1] for _ in range(3)]
    right = sess.run(correct)
  assert all(np.isfinite(losses)) and right.shape == (8,)


def one_step(build, num_devices, num_batches, what='tower'):
  # Builds a trainer's step as its script does, on num_devices virtual CPU
  # devices, and runs it once; returns {op name: type} of the step.
  devices, config = hardware.tower_devices(num_devices, True, what)
  with tf.Graph().as_default() as graph:
    with tf.device('/cpu:0'):
      batches = cifar10.distorted_batches(data_dir, 8, num_batches)
    train_op, loss, scaffold = build(batches, devices)
    built = {op.name: op.type for op in graph.get_operations()}
    with tf1.Session(config=config) as sess:
      sess.run([tf1.global_variables_initializer(),
                tf1.local_variables_initializer()])
      if scaffold.local_init_op is not None:
        sess.run(scaffold.local_init_op)
      value = sess.run([train_op, loss])[1]
  assert np.isfinite(value), build
  print('STEP')
  return built


with open(ops_file, 'w') as f:
  json.dump(one_step(lambda b, d: cifar10_train.build_train_op(b, ['']),
                     1, 1), f)
one_step(multi.build_train_op, 2, 2)  # Shared variables.
one_step(lambda b, d: cifar10_replicated.builder(d, multi.tower_loss)(b, d),
         2, 2)
one_step(model_parallel.build_train_op, 2, 1, 'part')

with tf.Graph().as_default():
  # The towers, with momentum and in bfloat16, on two batches.
  opts = options.DEFAULT._replace(use_bf16=True)
  batches = cifar10.distorted_batches(data_dir, 8, 2, opts)
  train_op, loss, scaffold = multi.build_train_op(
      batches, ['/cpu:0', '/cpu:0'], recipe.TUTORIAL._replace(
          optimizer='momentum'), opts)
  with tf1.Session() as sess:
    sess.run([tf1.global_variables_initializer(),
              tf1.local_variables_initializer()])
    assert np.isfinite(sess.run([train_op, loss])[1])

print('FLAGS PARSED', tf1.flags.FLAGS.is_parsed())
"""


def test_a_notebook_builds_every_trainers_step_and_the_scripts_graph(
    fake_data_dir, tmp_path):
  """In a process whose command line is a kernel's, no flag parsed: one
  step of each trainer's graph runs, and one tower's step is the graph the
  script writes (TF1's control flow, which the model sets: a tf.cond as
  Switch and Merge, not If), but for what its session adds."""
  ops_file = str(tmp_path / 'ops.json')
  result = subprocess.run([sys.executable, '-c', NOTEBOOK % (
      REPO, fake_data_dir, ops_file)], capture_output=True, text=True,
                          timeout=600, env=script_env())
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.count('STEP') == 4
  assert 'FLAGS PARSED False' in result.stdout
  with open(ops_file) as f:
    notebook = json.load(f)
  script = train(fake_data_dir, str(tmp_path / 'train'), '--max_steps=1',
                 '--batch_size=8')
  assert script.returncode == 0, script.stderr[-3000:]
  written = script_graph(str(tmp_path / 'train'))
  assert {'Switch', 'Merge'} <= set(notebook.values())
  assert not {'If', 'StatelessIf'} & set(written.values())
  assert {name: written.get(name) for name in notebook} == notebook
  assert {name.split('/')[0] for name in set(written) - set(notebook)} == {
      'session', 'global_step'}


# Imports one trainer, then runs another's --help.
HELP_AFTER_IMPORT = """
import runpy, sys
sys.path.insert(0, %r)
import %s
sys.argv = [%r, '--help']
runpy.run_path(%r, run_name='__main__')
"""


@pytest.mark.parametrize('imported, script, default', [
    ('cifar10_train', 'cifar10_multi_gpu_train.py', '1000000'),
    ('cifar10_multi_gpu_train', 'cifar10_train.py', '100000'),
    ('cifar10_train', 'cifar10_distributed_train.py', '1000000'),
    ('cifar10_multi_gpu_train', 'cifar10_model_parallel_train.py', '100000'),
])
def test_max_steps_default_is_the_scripts_whatever_was_imported(
    imported, script, default):
  path = '%s/%s' % (REPO, script)
  result = subprocess.run([sys.executable, '-c', HELP_AFTER_IMPORT % (
      REPO, imported, path, path)], capture_output=True, text=True,
                          timeout=600, env=script_env())
  assert result.returncode == 0, result.stderr[-3000:]
  match = re.search(r"--max_steps: .*\n\s+\(default: '(\d+)'\)",
                    result.stdout)
  assert match and match.group(1) == default, result.stdout[-2000:]
