"""The distributed trainer on loopback: 1 ps + 2 workers, sync and async."""

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from absl.testing import flagsaver
import numpy as np
import tensorflow as tf

import cifar10
import cifar10_distributed_train as dist
from conftest import REPO, checkpoint_step, error_lines, run_script

tf1 = tf.compat.v1

DONE_LINE = re.compile(r'^Worker (\d): done after (\d+) steps of its own '
                       r'\((\d+) examples\)\.$', re.M)


def _free_ports(n):
  """n distinct free TCP ports on 127.0.0.1."""
  sockets = [socket.socket() for _ in range(n)]
  for s in sockets:
    s.bind(('127.0.0.1', 0))
  ports = [s.getsockname()[1] for s in sockets]
  for s in sockets:
    s.close()
  return ports


def _hosts(ports):
  return ['--ps_hosts=127.0.0.1:%d' % ports[0],
          '--worker_hosts=127.0.0.1:%d,127.0.0.1:%d' % tuple(ports[1:])]


def _start(*args):
  """Starts a task of cifar10_distributed_train.py in the background."""
  return subprocess.Popen(
      [sys.executable, os.path.join(REPO, 'cifar10_distributed_train.py')]
      + list(args), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True)


def _wait_for_line(process, pattern, timeout):
  """Reads process's stdout until a line matches; returns the lines read."""
  lines = []
  deadline = time.time() + timeout
  while time.time() < deadline:
    line = process.stdout.readline()
    if not line:
      break
    lines.append(line)
    if re.search(pattern, line):
      return lines
  raise AssertionError('no line matching %r in %ds:\n%s'
                       % (pattern, timeout, ''.join(lines)))


def _finish(process, timeout):
  """Waits for process; returns (returncode, stdout, stderr)."""
  out, err = process.communicate(timeout=timeout)
  return process.returncode, out, err


def _run_cluster(flags):
  """Runs 1 ps and 2 workers to the end.

  Returns:
    (returncode, stdout, stderr) of worker 1, worker 0 and the ps task.
  """
  common = _hosts(_free_ports(3)) + flags
  tasks = [_start('--job_name=ps', '--task_index=0', *common),
           _start('--job_name=worker', '--task_index=0', *common),
           _start('--job_name=worker', '--task_index=1', *common)]
  try:
    return [_finish(p, timeout=300) for p in tasks[::-1]]
  finally:
    for p in tasks:
      if p.poll() is None:
        p.kill()


def test_sync_cluster_on_loopback_trains_exits_and_evaluates(
    real_data_dir, tmp_path):
  train_dir = str(tmp_path / 'train')
  flags = ['--data_dir=' + real_data_dir, '--train_dir=' + train_dir,
           '--batch_size=16', '--log_frequency=10', '--stall_report_secs=3']
  common = _hosts(_free_ports(3)) + flags + ['--max_steps=30']
  ps = _start('--job_name=ps', '--task_index=0', *common)
  chief = _start('--job_name=worker', '--task_index=0', *common)
  try:
    # Alone, the chief's first synchronous step waits for worker 1, and
    # says so.
    early = _wait_for_line(chief, r'a step has waited 3 s', timeout=120)
    worker = _start('--job_name=worker', '--task_index=1', *common)
    results = [_finish(chief, timeout=300)]
    chief_exit = time.time()
    results += [_finish(p, timeout=300) for p in (worker, ps)]
    others_after_chief = time.time() - chief_exit
  finally:
    for p in (ps, chief):
      if p.poll() is None:
        p.kill()
  for rc, out, err in results:
    assert rc == 0, out[-2000:] + err[-3000:]
  # Everyone is gone within seconds of the chief (no 60 or 120 s hang).
  assert others_after_chief < 15
  chief_out = ''.join(early) + results[0][1]
  steps = {int(m.group(1)): int(m.group(2))
           for m in DONE_LINE.finditer(chief_out + results[1][1])}
  assert sorted(steps) == [0, 1]
  global_step = checkpoint_step(train_dir)
  assert 30 <= global_step <= 31
  # Every global step aggregated one batch of each of the 2 workers; a
  # worker's last gradient may arrive after the end and be dropped.
  assert 2 * global_step <= sum(steps.values()) <= 2 * global_step + 2
  assert all(global_step - 2 <= s <= global_step + 2 for s in steps.values())
  assert 'ps task 0: 2 of 2 workers done.' in results[2][1]

  result = run_script('cifar10_eval.py', '--run_once',
                      '--data_dir=' + real_data_dir,
                      '--checkpoint_dir=' + train_dir,
                      '--eval_dir=' + str(tmp_path / 'eval'),
                      '--num_examples=256')
  assert result.returncode == 0, result.stderr[-2000:]
  assert re.search(r'precision @ 1 = \d\.\d{3}', result.stdout)

  # A restarted cluster resumes from the chief's latest checkpoint.
  results = _run_cluster(flags + ['--max_steps=%d' % (global_step + 10)])
  assert all(rc == 0 for rc, _, _ in results), results[1][2][-3000:]
  assert 'Resuming from %s/model.ckpt-%d.' % (train_dir, global_step) in (
      results[1][1])
  reached = checkpoint_step(train_dir)
  assert reached >= global_step + 10

  # Restarted at that --max_steps, every task says so and exits, and the
  # chief writes nothing.
  files = sorted(os.listdir(train_dir))
  mtimes = [os.stat(os.path.join(train_dir, f)).st_mtime_ns for f in files]
  results = _run_cluster(flags + ['--max_steps=%d' % reached])
  assert all(rc == 0 for rc, _, _ in results), results[1][2][-3000:]
  for worker, (_, out, err) in zip((1, 0), results):
    assert ('Worker %d: Training in %s has reached step %d, --max_steps is '
            '%d: nothing to do.' % (worker, train_dir, reached, reached)) in out
    assert 'Worker %d: done after 0 steps' % worker in out
    assert 'never used' not in err and 'Traceback' not in err
  assert sorted(os.listdir(train_dir)) == files
  assert mtimes == [os.stat(os.path.join(train_dir, f)).st_mtime_ns
                    for f in files]


def test_port_in_use_is_one_line(fake_data_dir):
  taken = socket.socket()
  taken.bind(('127.0.0.1', 0))
  taken.listen()
  port = taken.getsockname()[1]
  try:
    result = run_script('cifar10_distributed_train.py', '--job_name=ps',
                        '--data_dir=' + fake_data_dir,
                        '--ps_hosts=127.0.0.1:%d' % port,
                        '--worker_hosts=127.0.0.1:1')
  finally:
    taken.close()
  assert result.returncode == 1
  assert error_lines(result.stderr) == [
      'Error: Cannot start the ps task 0 server at 127.0.0.1:%d: Could not '
      'start gRPC server. Is the port in use?' % port]


def test_async_chief_goes_on_when_a_worker_is_killed(real_data_dir, tmp_path):
  ports = _free_ports(3)
  train_dir = str(tmp_path / 'train')
  common = _hosts(ports) + [
      '--data_dir=' + real_data_dir, '--train_dir=' + train_dir,
      '--batch_size=16', '--max_steps=60', '--log_frequency=5',
      '--nosync_replicas']
  ps = _start('--job_name=ps', '--task_index=0', *common)
  chief = _start('--job_name=worker', '--task_index=0', *common)
  worker = _start('--job_name=worker', '--task_index=1', *common)
  try:
    _wait_for_line(worker, r'^Worker 1: .*step \d+, loss', timeout=180)
    worker.kill()  # kill -9: no goodbye to the ps.
    worker.wait(timeout=30)
    rc, out, err = _finish(chief, timeout=300)
    assert rc == 0, out[-2000:] + err[-3000:]
    assert checkpoint_step(train_dir) >= 60
    assert DONE_LINE.search(out).group(1) == '0'
    # The ps waits for the killed worker's token: Ctrl-C stops it.
    assert ps.poll() is None
    ps.send_signal(signal.SIGINT)
    assert ps.wait(timeout=30) == 0
    assert "ps task 0: stopped by signal 2." in ps.stdout.read()
  finally:
    for p in (ps, chief, worker):
      if p.poll() is None:
        p.kill()


def test_one_sync_step_equals_one_step_on_both_batches(tmp_path):
  rng = np.random.RandomState(5)
  images = rng.normal(size=(2, 8, 24, 24, 3)).astype(np.float32)
  labels = rng.randint(0, 10, size=(2, 8)).astype(np.int32)
  ports = _free_ports(3)
  cluster = tf1.train.ClusterSpec({
      'ps': ['127.0.0.1:%d' % ports[0]],
      'worker': ['127.0.0.1:%d' % p for p in ports[1:]]})
  servers = [tf1.train.Server(cluster, job, index)
             for job, index in (('ps', 0), ('worker', 0), ('worker', 1))]
  initial = {}

  def record_initial(scaffold, session):
    del scaffold
    initial.update({v.op.name: session.run(v)
                    for v in tf1.global_variables()})

  with flagsaver.flagsaver(batch_size=8, max_steps=1, num_gpus=1,
                           train_dir=str(tmp_path), sync_replicas=True):
    steps = {}

    def run_worker(index):
      steps[index] = dist.train(
          servers[index + 1], cluster, index, ['/cpu:0'],
          make_batches=lambda: [(tf.constant(images[index]),
                                 tf.constant(labels[index]))],
          init_fn=record_initial if index == 0 else None)
    threads = [threading.Thread(target=run_worker, args=(i,)) for i in (0, 1)]
    for t in threads:
      t.start()
    for t in threads:
      t.join(timeout=120)
  assert steps == {0: 1, 1: 1}
  reader = tf.train.load_checkpoint(str(tmp_path))
  assert reader.get_tensor('global_step') == 1

  # One step of the single-tower trainer on the 16 images of both.
  with flagsaver.flagsaver(batch_size=16), tf.Graph().as_default():
    global_step = tf1.train.get_or_create_global_step()
    total_loss = cifar10.loss(
        cifar10.inference(tf.constant(images.reshape(16, 24, 24, 3))),
        tf.constant(labels.reshape(16)))
    train_op = cifar10.train(total_loss, global_step)
    variables = tf1.trainable_variables()
    averages = [v for v in tf1.global_variables()
                if v.op.name.endswith('/ExponentialMovingAverage')]
    assert len(averages) == 10
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      for v in variables + averages:
        v.load(initial[v.op.name], sess)
      sess.run(train_op)
      expected = {v.op.name: sess.run(v) for v in variables + averages}
  assert not np.array_equal(expected['conv1/weights'],
                            initial['conv1/weights'])
  for name, value in expected.items():
    np.testing.assert_allclose(reader.get_tensor(name), value, rtol=1e-5,
                               atol=1e-6, err_msg=name)


def test_variables_on_ps_tasks_towers_on_the_worker():
  cluster = tf1.train.ClusterSpec({
      'ps': ['127.0.0.1:1', '127.0.0.1:2'],
      'worker': ['127.0.0.1:3', '127.0.0.1:4']})
  with flagsaver.flagsaver(batch_size=8, num_gpus=2), tf.Graph().as_default():
    batch = (tf.zeros([8, 24, 24, 3]), tf.zeros([8], tf.int32))
    dist.build_worker_graph(cluster, 1, ['/cpu:0', '/cpu:1'], [batch, batch])
    graph = tf1.get_default_graph()
    model = tf1.global_variables()
    # Round-robin over both ps tasks.
    assert {v.device[:len('/job:ps/task:0')] for v in model} == {
        '/job:ps/task:0', '/job:ps/task:1'}
    convs = {op.device for op in graph.get_operations()
             if op.type == 'Conv2D'}
    assert convs == {'/job:worker/task:1/device:CPU:0',
                     '/job:worker/task:1/device:CPU:1'}
