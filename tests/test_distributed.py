"""The distributed trainer on loopback: 1 ps + 2 workers, sync and async."""

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time

from absl.testing import flagsaver
import numpy as np
import pytest
import tensorflow as tf

import cifar10
import cifar10_distributed_train as dist
import cifar10_multi_gpu_train as multi
import cifar10_replicated
from conftest import (checkpoint_step, error_lines, evaluate, run_script,
                      start_script)
from machinery import cluster
from machinery import hardware
from machinery import recipe as recipes
from machinery import worker_session

tf1 = tf.compat.v1

# Some tests here run the scripts' own code, which reads the flags.
pytestmark = pytest.mark.usefixtures('parsed_flags')

DONE_LINE = re.compile(r'^Worker (\d): done after (\d+) steps of its own '
                       r'\((\d+) examples\)\.$', re.M)


def _hosts(ports):
  return ['--ps_hosts=127.0.0.1:%d' % ports[0],
          '--worker_hosts=127.0.0.1:%d,127.0.0.1:%d' % tuple(ports[1:])]


def _start(*args, tf_config=None):
  """Starts a task of cifar10_distributed_train.py in the background.

  Args:
    *args: its flags.
    tf_config: None, or the dict to give it as TF_CONFIG.
  """
  env = dict(os.environ)
  env.pop('TF_CONFIG', None)
  if tf_config is not None:
    env['TF_CONFIG'] = json.dumps(tf_config)
  return start_script('cifar10_distributed_train.py', *args, env=env)


def _kill_left(*processes):
  """Kills those of processes (None: never started) still running, so that
  no test leaves a task behind."""
  for p in processes:
    if p is not None and p.poll() is None:
      p.kill()


def _wait_for_line(process, pattern, timeout):
  """Waits for a line of process's stdout to match; returns the lines read
  so far."""
  process.out.wait_for(pattern, timeout)
  return process.out.lines


def _finish(process, timeout):
  """Waits for process; returns (returncode, stdout, stderr).

  Raises:
    subprocess.TimeoutExpired: it ran past timeout (it is killed first, so
      that no failed test leaves a task behind).
  """
  try:
    process.wait(timeout=timeout)
  except subprocess.TimeoutExpired:
    process.kill()
    process.wait()
    raise
  return process.returncode, process.out.text(), process.err.text()


def _run_cluster(flags):
  """Runs 1 ps and 2 workers to the end.

  Returns:
    (returncode, stdout, stderr) of worker 1, worker 0 and the ps task.
  """
  common = _hosts(cluster.free_local_ports(3)) + flags
  tasks = [_start('--job_name=ps', '--task_index=0', *common),
           _start('--job_name=worker', '--task_index=0', *common),
           _start('--job_name=worker', '--task_index=1', *common)]
  try:
    return [_finish(p, timeout=300) for p in tasks[::-1]]
  finally:
    _kill_left(*tasks)


def test_sync_cluster_on_loopback_trains_exits_and_evaluates(
    real_data_dir, tmp_path):
  train_dir = str(tmp_path / 'train')
  flags = ['--data_dir=' + real_data_dir, '--train_dir=' + train_dir,
           '--batch_size=16', '--log_frequency=10', '--stall_report_secs=3']
  common = _hosts(cluster.free_local_ports(3)) + flags + ['--max_steps=30']
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
    _kill_left(ps, chief)
  for rc, out, err in results:
    assert rc == 0, out[-2000:] + err[-3000:]
  # Everyone is gone soon after the chief (no 60 or 120 s hang), on a
  # busy machine too: measured 0.0 s in 3 runs, two tests at a time.
  assert others_after_chief < 45
  assert 'a step has waited 3 s' in ''.join(early)
  chief_out = results[0][1]
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

  result = evaluate(real_data_dir, train_dir, tmp_path / 'eval',
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
      'start gRPC server. Is the port in use, or the host not this '
      'machine?' % port]


def test_async_chief_goes_on_when_a_worker_is_killed(real_data_dir, tmp_path):
  ports = cluster.free_local_ports(3)
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
    assert "ps task 0: stopped by signal 2." in ps.out.text()
  finally:
    _kill_left(ps, chief, worker)


def test_sigterm_stops_a_ps_task(fake_data_dir):
  ps = _start('--job_name=ps', '--data_dir=' + fake_data_dir,
              *_hosts(cluster.free_local_ports(3)))
  try:
    _wait_for_line(ps, r'^ps task 0 serving', timeout=120)
    ps.send_signal(signal.SIGTERM)
    rc, out, err = _finish(ps, timeout=60)
  finally:
    _kill_left(ps)
  assert rc == 0, err[-3000:]
  assert out.splitlines()[-1] == 'ps task 0: stopped by signal 15.'


def test_restarted_sync_worker_rejoins(fake_data_dir, tmp_path):
  train_dir = str(tmp_path / 'train')
  common = _hosts(cluster.free_local_ports(3)) + [
      '--data_dir=' + fake_data_dir, '--train_dir=' + train_dir,
      '--batch_size=8', '--max_steps=40', '--log_frequency=1',
      '--stall_report_secs=3']
  ps = _start('--job_name=ps', '--task_index=0', *common)
  chief = _start('--job_name=worker', '--task_index=0', *common)
  worker = _start('--job_name=worker', '--task_index=1', *common)
  restarted = None
  try:
    _wait_for_line(worker, r'^Worker 1: .*step 5, loss', timeout=300)
    worker.kill()  # kill -9.
    worker.wait(timeout=30)
    # Every update needs both: the chief waits, and says so.
    _wait_for_line(chief, r'a step has waited 3 s', timeout=120)
    restarted = _start('--job_name=worker', '--task_index=1', *common)
    results = [_finish(p, timeout=300) for p in (chief, restarted, ps)]
  finally:
    _kill_left(ps, chief, worker, restarted)
  for rc, out, err in results:
    assert rc == 0, out[-2000:] + err[-3000:]
  steps = {int(m.group(1)): int(m.group(2))
           for m in DONE_LINE.finditer(results[0][1] + results[1][1])}
  assert steps[1] > 0  # The restarted worker took part in updates.
  assert 40 <= checkpoint_step(train_dir) <= 41
  assert 'ps task 0: 2 of 2 workers done.' in results[2][1]


def test_one_sync_step_equals_one_step_on_both_batches(monkeypatch,
                                                      tmp_path):
  rng = np.random.RandomState(5)
  images = rng.normal(size=(2, 8, 24, 24, 3)).astype(np.float32)
  labels = rng.randint(0, 10, size=(2, 8)).astype(np.int32)
  ports = cluster.free_local_ports(3)
  tasks = _tasks(['127.0.0.1:%d' % ports[0]],
                 ['127.0.0.1:%d' % p for p in ports[1:]])
  initial, steps, _ = _train_in_threads(
      monkeypatch, tasks, cifar10_replicated.PARAMETER_SERVER, images, labels, tmp_path)
  assert steps == {0: 1, 1: 1}
  reader = tf.train.load_checkpoint(str(tmp_path))
  assert reader.get_tensor('global_step') == 1
  _assert_one_step_on_both_batches(initial, reader, images, labels)


def _tasks(ps_hosts, worker_hosts):
  """The Task of every worker of a cluster."""
  return [cluster.Task(ps_hosts, worker_hosts, 'worker', i, 'a test')
          for i in range(len(worker_hosts))]


class _Values(tf1.train.SessionRunHook):
  """Keeps the global variables' values at the start of a session (once
  they are initialized or restored) and at its end."""

  def __init__(self):
    self.initial = {}
    self.values = {}

  def after_create_session(self, session, coord):
    self.initial = {v.op.name: session.run(v)
                    for v in tf1.global_variables()}

  def end(self, session):
    self.values = {v.op.name: session.run(v) for v in tf1.global_variables()}


def _train_in_threads(monkeypatch, tasks, mode, images, labels, train_dir,
                      max_steps=1):
  """Trains every worker of tasks (and serves the ps tasks) in threads, on
  one fixed batch each.

  Each worker's thread is named for its index: the input pipeline gives it
  its own fixed batch, and its session a _Values hook.

  Returns:
    (the chief's initial values, {worker: steps run}, {worker: its global
    variables' values at the end}).
  """
  ps_hosts, worker_hosts = tasks[0].ps_hosts, tasks[0].worker_hosts
  servers, configs, values = {}, {}, {}
  for task in tasks:
    _, configs[task.task_index] = hardware.tower_devices(
        1, virtual=True)
    servers[task.task_index] = cluster.start_server(
        task, cluster.server_config(
            task, mode == cifar10_replicated.REPLICATED,
            configs[task.task_index]))
    values[task.task_index] = _Values()
  for i in range(len(ps_hosts)):
    ps = cluster.Task(ps_hosts, worker_hosts, 'ps', i, 'a test')
    servers['ps', i] = cluster.start_server(
        ps, cluster.server_config(ps, False, None))

  def this_worker():
    return int(threading.current_thread().name)
  monkeypatch.setattr(cifar10, 'distorted_batches', lambda *args, **kwargs: [
      (tf.constant(images[this_worker()]),
       tf.constant(labels[this_worker()]))])
  role_hooks = worker_session.WorkerRole.hooks
  monkeypatch.setattr(worker_session.WorkerRole, 'hooks', lambda role: (
      role_hooks(role) + [values[this_worker()]]))
  steps = {}
  with flagsaver.flagsaver(batch_size=8, max_steps=max_steps, num_gpus=1,
                           train_dir=str(train_dir), sync_replicas=True,
                           peer_timeout_secs=60):

    def run_worker(task):
      steps[task.task_index] = dist.run_training(
          servers[task.task_index], task, mode, ['/cpu:0'],
          configs[task.task_index], recipes.TUTORIAL)
    threads = [threading.Thread(target=run_worker, args=(t,),
                                name=str(t.task_index)) for t in tasks]
    for t in threads:
      t.start()
    for t in threads:
      t.join(timeout=120)
  return (values[0].initial, steps,
          {index: hook.values for index, hook in values.items()})


def _assert_one_step_on_both_batches(initial, reader, images, labels):
  """The checkpoint (reader) holds one step of the single-tower trainer
  from initial on the 16 images of both workers."""
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
      sess.run([tf1.global_variables_initializer(),
                tf1.local_variables_initializer()])
      for v in variables + averages:
        v.load(initial[v.op.name], sess)
      sess.run(train_op)
      expected = {v.op.name: sess.run(v) for v in variables + averages}
  assert not np.array_equal(expected['conv1/weights'],
                            initial['conv1/weights'])
  for name, value in expected.items():
    np.testing.assert_allclose(reader.get_tensor(name), value, rtol=1e-5,
                               atol=1e-6, err_msg=name)


def test_allreduce_workers_step_as_one_tower_on_both_batches_and_agree(
    monkeypatch, tmp_path):
  rng = np.random.RandomState(6)
  images = rng.normal(size=(2, 8, 24, 24, 3)).astype(np.float32)
  labels = rng.randint(0, 10, size=(2, 8)).astype(np.int32)
  tasks = _tasks([], ['127.0.0.1:%d' % p for p in cluster.free_local_ports(2)])
  initial, steps, final = _train_in_threads(
      monkeypatch, tasks, cifar10_replicated.REPLICATED, images, labels, tmp_path)
  assert steps == {0: 1, 1: 1}
  reader = tf.train.load_checkpoint(str(tmp_path))
  assert reader.get_tensor('global_step') == 1
  _assert_one_step_on_both_batches(initial, reader, images, labels)
  # Worker 1 started from the chief's values (its own initial ones were
  # other random numbers) and applied the same mean: the copies are equal.
  assert len(final[0]) == 21 and sorted(final[0]) == sorted(final[1])
  for name, value in final[0].items():
    np.testing.assert_array_equal(final[1][name], value, err_msg=name)
    np.testing.assert_array_equal(reader.get_tensor(name), value,
                                  err_msg=name)


def test_variables_on_ps_tasks_cpus_towers_on_the_worker():
  task = _tasks(['127.0.0.1:1', '127.0.0.1:2'],
                ['127.0.0.1:3', '127.0.0.1:4'])[1]
  with tf.Graph().as_default():
    batches = [(tf.zeros([8, 24, 24, 3]), tf.zeros([8], tf.int32))] * 2
    dist.build_worker_graph(task, batches, ['/cpu:0', '/cpu:1'], True,
                            recipes.TUTORIAL)
    graph = tf1.get_default_graph()
    model = tf1.global_variables()
    # Round-robin over both ps tasks, on their CPUs (the global step and
    # the loss scale too), never a ps host's GPU.
    assert {v.device for v in model} == {
        '/job:ps/task:0/device:CPU:0', '/job:ps/task:1/device:CPU:0'}
    convs = {op.device for op in graph.get_operations()
             if op.type == 'Conv2D'}
    assert convs == {'/job:worker/task:1/device:CPU:0',
                     '/job:worker/task:1/device:CPU:1'}


def test_allreduce_dead_peer_is_one_line_and_the_cluster_resumes(
    fake_data_dir, tmp_path):
  train_dir = str(tmp_path / 'train')
  hosts = '--worker_hosts=' + ','.join('127.0.0.1:%d' % p
                                       for p in cluster.free_local_ports(2))
  common = [hosts, '--data_dir=' + fake_data_dir, '--batch_size=8',
            '--log_frequency=1', '--peer_timeout_secs=15',
            '--save_checkpoint_steps=5']
  chief = _start('--job_name=worker', '--task_index=0', '--max_steps=100000',
                 '--train_dir=' + train_dir, *common)
  worker = _start('--job_name=worker', '--task_index=1', '--max_steps=100000',
                  *common)
  try:
    lines = _wait_for_line(chief, r'^Worker 0: .*step 10, loss', timeout=300)
    assert 'every worker holds the variables' in lines[0], lines
    worker.kill()  # kill -9: the chief waits in its all-reduce.
    worker.wait(timeout=30)
    killed_at = time.time()
    rc, out, err = _finish(chief, timeout=120)
    waited = time.time() - killed_at
  finally:
    _kill_left(chief, worker)
  assert rc == 1, out[-2000:] + err[-3000:]
  # At most the timeout, and some for the exit: the chief learns of a
  # killed peer at once (1.0-2.2 s in 3 runs, two tests at a time).
  assert waited < 15 + 30, waited
  match = re.match(
      r'Error: Worker 0: gave up waiting for worker 1 \(127\.0\.0\.1:\d+\) '
      r'after at most 15 s: it does not answer \(stopped, or never '
      r'started\)\. Restart the whole cluster: it resumes from the chief\'s '
      r'latest checkpoint in its --train_dir\.$', '\n'.join(error_lines(err)))
  assert match, error_lines(err) or err[-3000:]
  saved = checkpoint_step(train_dir)
  assert saved >= 10

  # Restarted, the cluster resumes from the chief's latest checkpoint.
  restarted = [_start('--job_name=worker', '--task_index=%d' % i,
                      '--max_steps=%d' % (saved + 5),
                      '--train_dir=' + train_dir, *common) for i in (0, 1)]
  results = [_finish(p, timeout=300) for p in restarted]
  for rc, out, err in results:
    assert rc == 0, out[-2000:] + err[-3000:]
  assert 'Resuming from %s/model.ckpt-%d.' % (train_dir, saved) in (
      results[0][1])
  assert checkpoint_step(train_dir) == saved + 5
  for i, (_, out, _) in enumerate(results):
    assert 'Worker %d: done after 5 steps of its own (40 examples).' % i in out


def test_three_tasks_from_tf_config_alone_train_and_finish(fake_data_dir,
                                                            tmp_path):
  ports = cluster.free_local_ports(3)
  hosts = {'chief': ['127.0.0.1:%d' % ports[0]],
           'worker': ['127.0.0.1:%d' % ports[1]],
           'ps': ['127.0.0.1:%d' % ports[2]]}
  train_dir = str(tmp_path / 'train')
  flags = ['--data_dir=' + fake_data_dir, '--train_dir=' + train_dir,
           '--batch_size=8', '--max_steps=20']
  tasks = [_start(*flags, tf_config={'cluster': hosts,
                                     'task': {'type': task, 'index': 0}})
           for task in ('PS', 'Chief', 'worker')]
  try:
    (_, ps_out, _), (chief_rc, chief_out, chief_err), (rc, out, err) = [
        _finish(p, timeout=300) for p in tasks]
  finally:
    _kill_left(*tasks)
  assert chief_rc == 0 and rc == 0, chief_err[-3000:] + err[-3000:]
  assert chief_out.startswith(
      'Worker 0 of a cluster of 2 worker(s) and 1 ps task(s), from '
      'TF_CONFIG; the ps tasks hold the variables.')
  assert out.startswith('Worker 1 of a cluster of 2 worker(s) and 1 ps '
                        'task(s), from TF_CONFIG;')
  assert ps_out.startswith('Ps 0 of a cluster of 2 worker(s) and 1 ps '
                           'task(s), from TF_CONFIG;')
  assert 'ps task 0: 2 of 2 workers done.' in ps_out
  assert 20 <= checkpoint_step(train_dir) <= 21
  # Every task says who can reach its server.
  for name, output, port in (('ps task 0', ps_out, ports[2]),
                             ('Worker 0', chief_out, ports[0]),
                             ('Worker 1', out, ports[1])):
    line = ('%s: its TensorFlow server listens on port %d of every network '
            'interface of this machine, without authentication: anyone who '
            'can reach that port can run anything on this machine as this '
            'user. Keep the cluster on a trusted network (docs/distributed.md,'
            ' "Who can reach the servers").' % (name, port))
    assert line in output.splitlines(), output[-2000:]


def test_allreduce_peer_that_never_starts_or_hangs_is_one_line(
    fake_data_dir, tmp_path):
  hosts = ['127.0.0.1:%d' % p for p in cluster.free_local_ports(2)]
  common = ['--worker_hosts=' + ','.join(hosts), '--data_dir=' + fake_data_dir,
            '--batch_size=8', '--log_frequency=1', '--peer_timeout_secs=10',
            '--max_steps=100000', '--train_dir=' + str(tmp_path / 'train')]
  # Worker 1 never starts: the chief's broadcast of its values waits for
  # it, 10 s, and no longer (start-up included, 15.2-15.4 s in 3 runs, two
  # tests at a time).
  started = time.time()
  rc, _, err = _finish(_start('--job_name=worker', '--task_index=0', *common),
                       timeout=300)
  assert rc == 1 and time.time() - started < 10 + 60, err[-3000:]
  assert error_lines(err) == [
      'Error: Worker 0: gave up waiting for worker 1 (%s) after at most 10 s: '
      'it does not answer (stopped, or never started). Restart the whole '
      'cluster: it resumes from the chief\'s latest checkpoint in its '
      '--train_dir.' % hosts[1]]
  # Worker 1 hangs (SIGSTOP) in the middle of training: its server still
  # takes connections, but its part of the all-reduce never comes.
  chief = _start('--job_name=worker', '--task_index=0', *common)
  worker = _start('--job_name=worker', '--task_index=1', *common)
  try:
    _wait_for_line(worker, r'^Worker 1: .*step 5, loss', timeout=300)
    worker.send_signal(signal.SIGSTOP)
    stopped = time.time()
    rc, _, err = _finish(chief, timeout=120)
    waited = time.time() - stopped
  finally:
    _kill_left(chief, worker)
  assert rc == 1 and waited < 10 + 60, err[-3000:]  # 10.9-11.1 s in 3 runs.
  assert error_lines(err) == [
      'Error: Worker 0: gave up waiting for a peer after at most 10 s: worker '
      '1 (%s) answers but did not take part (hung?). Restart the whole '
      'cluster: it resumes from the chief\'s latest checkpoint in its '
      '--train_dir.' % hosts[1]]
