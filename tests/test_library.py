"""The model as a library: its functions run on their values, with no flag
read, in a process whose command line the flags do not know (a notebook
kernel's); and no flag's default depends on what a process imported."""

import re
import subprocess
import sys

import pytest

from conftest import REPO

# A notebook: Jupyter's kernel runs with '-f <connection file>', which no
# flag of ours knows; reading a flag would parse it and fail
# (UnrecognizedFlagError: Unknown command line flag 'f').
NOTEBOOK = """
import sys
sys.argv = ['ipykernel_launcher.py', '-f', '/tmp/kernel-1234.json']
sys.path.insert(0, %r)
import numpy as np
import tensorflow as tf
import cifar10
import cifar10_eval
import cifar10_multi_gpu_train as multi
import cifar10_train
from machinery import options, recipe
tf1 = tf.compat.v1
data_dir = %r

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

with tf.Graph().as_default():
  # The towers, with momentum and in bfloat16, on two batches.
  opts = options.DEFAULT._replace(use_bf16=True)
  batches = cifar10.distorted_batches(2, data_dir, 8, opts)
  train_op, loss, scaffold = multi.build_train_op(
      batches, ['/cpu:0', '/cpu:0'], recipe.TUTORIAL._replace(
          optimizer='momentum'), opts)
  with tf1.Session() as sess:
    sess.run([tf1.global_variables_initializer(),
              tf1.local_variables_initializer()])
    assert np.isfinite(sess.run([train_op, loss])[1])

with tf.Graph().as_default():
  train_op, loss = cifar10_train.build_train_op(
      *cifar10.distorted_inputs(data_dir, 8))

print('FLAGS PARSED', tf1.flags.FLAGS.is_parsed())
"""


def test_the_model_runs_in_a_notebook_reading_no_flag(fake_data_dir):
  result = subprocess.run([sys.executable, '-c', NOTEBOOK % (
      REPO, fake_data_dir)], capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'FLAGS PARSED False' in result.stdout


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
                          timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  match = re.search(r"--max_steps: .*\n\s+\(default: '(\d+)'\)",
                    result.stdout)
  assert match and match.group(1) == default, result.stdout[-2000:]
