"""The cluster of a distributed task (machinery/cluster.py): from the command
line or TF_CONFIG, its mode, its servers' configs, and Kubeflow's TFJobs."""

import glob
import json
import os
import re
import shutil
import subprocess
import sys

from absl.testing import flagsaver
import pytest
import yaml

import cifar10_distributed_train as dist
from conftest import REPO, error_lines, run_script, script_env
from machinery import cluster
from machinery import errors
from machinery import hardware

FLAGS = cluster.FLAGS

CLUSTER = {'chief': ['c0:2222'], 'worker': ['w0:2222', 'w1:2222'],
           'ps': ['p0:2222']}


def _parse(hosts, task_type, index):
  return cluster.parse_tf_config(json.dumps(
      {'cluster': hosts, 'task': {'type': task_type, 'index': index}}))


@pytest.mark.parametrize('task_type,index,job,expected_index', [
    ('chief', 0, 'worker', 0), ('worker', 0, 'worker', 1),
    ('worker', 1, 'worker', 2), ('ps', 0, 'ps', 0),
    ('CHIEF', 0, 'worker', 0), ('Worker', 1, 'worker', 2)])
def test_tf_config_chief_is_worker_0_and_workers_follow(
    task_type, index, job, expected_index):
  assert _parse(CLUSTER, task_type, index) == (
      ['p0:2222'], ['c0:2222', 'w0:2222', 'w1:2222'], job, expected_index)


def test_tf_config_without_chief_or_ps_and_in_sparse_form():
  assert _parse({'worker': ['a:1', 'b:2']}, 'worker', 1) == (
      [], ['a:1', 'b:2'], 'worker', 1)
  assert _parse({'Worker': {'1': 'b:2', '0': 'a:1'}}, 'worker', 0) == (
      [], ['a:1', 'b:2'], 'worker', 0)


@pytest.mark.parametrize('text,what', [
    ('{"cluster": ', 'is not JSON'),
    ('{"task": {"type": "worker"}}', 'has no "cluster" object'),
    ('{"cluster": {"worker": ["a:1"], "evaluator": ["e:1"]}, "task": '
     '{"type": "worker"}}', 'cluster has task type(s) evaluator: this '
     'trainer runs chief, worker and ps tasks'),
    ('{"cluster": {"chief": ["a:1", "b:1"]}, "task": {"type": "chief"}}',
     'cluster lists 2 chiefs: give one'),
    ('{"cluster": {"worker": ["a"]}, "task": {"type": "worker"}}',
     'cluster "worker" is ["a"]: give a list of host:port strings'),
    ('{"cluster": {"ps": ["a:1"]}, "task": {"type": "ps"}}',
     'cluster has neither "chief" nor "worker" tasks'),
    ('{"cluster": {"worker": ["a:1"]}}', 'has no "task" object with a "type"'),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "master"}}',
     'task type is "master", not one of chief, worker, ps'),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", '
     '"index": 1}}', 'task is worker 1, but the cluster lists 1 worker '
     'task(s)'),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", '
     '"index": "0"}}', 'task index is "0", not a number from 0'),
])
def test_bad_tf_config_says_what_is_wrong(text, what):
  with pytest.raises(errors.UsageError) as error:
    cluster.parse_tf_config(text)
  assert str(error.value).startswith('TF_CONFIG %s' % what), str(error.value)
  assert '\n' not in str(error.value)


def test_bad_tf_config_is_one_line_from_the_script(fake_data_dir):
  env = dict(os.environ, TF_CONFIG='{"cluster": {"worker": ["a:1"]}, '
             '"task": {"type": "evaluator"}}')
  result = run_script('cifar10_distributed_train.py',
                      '--data_dir=' + fake_data_dir, env=env)
  assert result.returncode == 1
  assert error_lines(result.stderr) == [
      'Error: TF_CONFIG task type is "evaluator", not one of chief, worker, '
      'ps. It should read like {"cluster": {"chief": ["host:port"], '
      '"worker": [...], "ps": [...]}, "task": {"type": "worker", "index": '
      '0}}.']


def _resolve(monkeypatch, tf_config, argv):
  """Returns the task and mode cifar10_distributed_train.py resolves from
  argv and tf_config (None: TF_CONFIG unset)."""
  if tf_config is None:
    monkeypatch.delenv('TF_CONFIG', raising=False)
  else:
    monkeypatch.setenv('TF_CONFIG', json.dumps(tf_config))
  with flagsaver.flagsaver():
    FLAGS.unparse_flags()
    FLAGS(['cifar10_distributed_train.py'] + argv)
    task = cluster.from_flags_or_tf_config()
    return task, dist.mode_of(task)


# The clusters a command line cannot make, each with the script's line.
IMPOSSIBLE_CLUSTERS = [
    (['--worker_hosts=127.0.0.1:2'],
     "Give this task's job: --job_name=ps or --job_name=worker."),
    (['--job_name=worker'],
     'Give the cluster: --worker_hosts=host:port,... (and '
     '--ps_hosts=host:port,... for parameter servers), or set TF_CONFIG.'),
    (['--job_name=ps', '--ps_hosts=127.0.0.1:1'],
     'Give the workers: --worker_hosts=host:port,...'),
    (['--job_name=worker', '--task_index=2', '--ps_hosts=127.0.0.1:1',
      '--worker_hosts=127.0.0.1:2,127.0.0.1:3'],
     '--task_index=2, but --worker_hosts lists 2 task(s).'),
    (['--job_name=ps', '--ps_hosts=127.0.0.1:1', '--worker_hosts=127.0.0.1:2',
      '--variable_update=replicated'],
     '--variable_update=replicated keeps the variables on the workers and '
     'all-reduces between them: give no ps tasks (1 are given, from the '
     'command line).'),
    (['--job_name=worker', '--worker_hosts=127.0.0.1:2',
      '--variable_update=parameter_server'],
     '--variable_update=parameter_server needs ps tasks: give --ps_hosts, or '
     'use --variable_update=replicated to all-reduce between the workers.'),
]


@pytest.mark.parametrize('args,message', IMPOSSIBLE_CLUSTERS)
def test_impossible_cluster_is_one_line(monkeypatch, args, message):
  """The script's two checks, in-process: the cluster and this task in it,
  then --variable_update against it; the next test runs one in the
  script."""
  with pytest.raises(errors.UsageError) as raised:
    _resolve(monkeypatch, None, args)
  assert str(raised.value) == message


def test_impossible_cluster_in_the_script_is_one_line(fake_data_dir):
  args, message = IMPOSSIBLE_CLUSTERS[-1]
  env = dict(os.environ)
  env.pop('TF_CONFIG', None)
  result = run_script('cifar10_distributed_train.py',
                      '--data_dir=' + fake_data_dir, *args, env=env)
  assert result.returncode == 1
  assert error_lines(result.stderr) == ['Error: ' + message]


def test_command_line_wins_over_tf_config(monkeypatch):
  tf_config = {'cluster': CLUSTER, 'task': {'type': 'worker', 'index': 1}}
  task, mode = _resolve(monkeypatch, tf_config, [])
  assert (task.job_name, task.task_index, task.source, mode) == (
      'worker', 2, 'TF_CONFIG', 'parameter_server')
  assert task.describe(all_reduce=False) == (
      'Worker 2 of a cluster of 3 worker(s) and 1 ps task(s), from '
      'TF_CONFIG; the ps tasks hold the variables.')
  task, _ = _resolve(monkeypatch, tf_config, ['--task_index=0'])
  assert (task.task_index, task.source) == (
      0, 'TF_CONFIG, the task from the command line')
  task, mode = _resolve(monkeypatch, tf_config, [
      '--worker_hosts=h:1,h:2', '--job_name=worker', '--task_index=1'])
  assert task == cluster.Task([], ['h:1', 'h:2'], 'worker', 1,
                              'the command line')
  assert mode == 'replicated'  # No ps tasks: all-reduce.


def test_workers_sharing_a_machine_take_their_own_gpus():
  hosts = ['a:1', 'a:2', 'b:1', 'a:3']
  def gpus(index, num_gpus, visible):
    task = cluster.Task([], hosts, 'worker', index, 'a test')
    return cluster.local_gpus(task, num_gpus, visible)
  assert [gpus(i, 2, 6) for i in (0, 1, 3)] == ['0,1', '2,3', '4,5']
  assert gpus(2, 2, 2) is None  # Alone on b: TensorFlow's choice.
  assert gpus(1, 2, 4) is None  # 3 workers on a need 6 GPUs.


def test_server_configs():
  ps = cluster.Task(['p:1'], ['w:1', 'w:2'], 'ps', 0, 'a test')
  config = cluster.server_config(ps, False, None)
  assert config.device_count['GPU'] == 0 and config.gpu_options.allow_growth
  worker = cluster.Task([], ['w:1', 'w:2'], 'worker', 1, 'a test')
  tower_config = hardware.session_config()
  config = cluster.session_config(worker, True, tower_config)
  assert config.experimental.collective_group_leader == (
      '/job:worker/replica:0/task:0')
  assert list(config.device_filters) == ['/job:worker/task:1']
  # Each collective chooses NCCL or not (hardware.all_reduce_between),
  # so the server forces it on none.
  assert not config.experimental.collective_nccl
  assert not tower_config.device_filters  # Not changed.


def _manifests(kind='TFJob'):
  """The manifests of a kind in docs/distributed.md, in order."""
  with open(os.path.join(REPO, 'docs', 'distributed.md')) as f:
    blocks = re.findall(r'```yaml\n(.*?)```', f.read(), re.S)
  documents = [yaml.safe_load(block) for block in blocks]
  assert all(documents) and len(documents) == 4, documents
  return [d for d in documents if d.get('kind') == kind]


def _kubeflow_tf_configs(job):
  """The TF_CONFIG Kubeflow's training operator gives each pod of a TFJob:
  lowercase task types, hosts from the headless service of each replica.

  Returns:
    A list of (replica type, index, container args, TF_CONFIG dict).
  """
  name = job['metadata']['name']
  namespace = job['metadata'].get('namespace', 'default')
  specs = job['spec']['tfReplicaSpecs']
  cluster = {}
  for replica_type, spec in specs.items():
    port = spec['template']['spec']['containers'][0]['ports'][0][
        'containerPort']
    cluster[replica_type.lower()] = [
        '%s-%s-%d.%s.svc:%d' % (name, replica_type.lower(), i, namespace,
                                port)
        for i in range(spec.get('replicas', 1))]
  pods = []
  for replica_type, spec in specs.items():
    container = spec['template']['spec']['containers'][0]
    for i in range(spec.get('replicas', 1)):
      pods.append((replica_type, i, container.get('args', []), {
          'cluster': cluster,
          'task': {'type': replica_type.lower(), 'index': i}}))
  return pods


def test_kubeflow_tfjob_manifests_start_the_intended_tasks(monkeypatch):
  jobs = _manifests()
  assert len(jobs) == 2
  seen = {}
  for job in jobs:
    assert job['apiVersion'] == 'kubeflow.org/v1'
    pods = _kubeflow_tf_configs(job)
    for replica_type, index, args, tf_config in pods:
      command = job['spec']['tfReplicaSpecs'][replica_type]['template'][
          'spec']['containers'][0]['command']
      assert command[-1] == 'cifar10_distributed_train.py', command
      task, mode = _resolve(monkeypatch, tf_config, args)
      expected = {'Chief': ('worker', 0), 'PS': ('ps', index),
                  'Worker': ('worker', index + ('Chief' in job['spec'][
                      'tfReplicaSpecs']))}[replica_type]
      assert (task.job_name, task.task_index) == expected, replica_type
      assert task.is_chief == (replica_type == 'Chief')
      assert task.worker_hosts[0].startswith(
          job['metadata']['name'] + '-chief-0.')
      seen.setdefault(mode, []).append(replica_type)
  # One manifest of each mode: PS, Chief and Workers; Chief and Workers.
  assert sorted(set(seen['parameter_server'])) == ['Chief', 'PS', 'Worker']
  assert sorted(set(seen['replicated'])) == ['Chief', 'Worker']


# The label Kubeflow's training operator (v1) puts on every pod of a TFJob.
JOB_NAME_LABEL = 'training.kubeflow.org/job-name'


def test_each_tfjob_has_a_policy_that_admits_its_own_pods_only():
  jobs, policies = _manifests(), _manifests('NetworkPolicy')
  assert len(policies) == len(jobs) == 2
  for job, policy in zip(jobs, policies):
    name = job['metadata']['name']
    ports = {spec['template']['spec']['containers'][0]['ports'][0][
        'containerPort'] for spec in job['spec']['tfReplicaSpecs'].values()}
    assert policy['apiVersion'] == 'networking.k8s.io/v1'
    spec = policy['spec']
    # It applies to the job's pods, every one of them, and to no others.
    assert spec['podSelector'] == {'matchLabels': {JOB_NAME_LABEL: name}}
    # It governs what comes in; one rule admits the job's own pods (no
    # namespace selector: of its namespace only), on the job's port.
    assert spec['policyTypes'] == ['Ingress']
    rule, = spec['ingress']
    assert rule['from'] == [{'podSelector': {
        'matchLabels': {JOB_NAME_LABEL: name}}}]
    assert rule['ports'] == [{'protocol': 'TCP', 'port': port}
                             for port in sorted(ports)]
    assert set(spec) == {'podSelector', 'policyTypes', 'ingress'}


def test_dockerfile_copies_what_the_scripts_import(tmp_path):
  """The image of docs/distributed.md holds what its COPY lines name: the
  trainer must start from those files alone."""
  with open(os.path.join(REPO, 'docs', 'distributed.md')) as f:
    copies = re.findall(r'^    COPY (.+) \S+$', f.read(), re.M)
  assert copies
  for sources in copies:
    for pattern in sources.split():
      for path in glob.glob(os.path.join(REPO, pattern)):
        name = os.path.basename(path.rstrip('/'))
        if os.path.isdir(path):
          shutil.copytree(path, str(tmp_path / name))
        else:
          shutil.copy(path, str(tmp_path / name))
  result = subprocess.run(
      [sys.executable, 'cifar10_distributed_train.py', '--help'],
      cwd=str(tmp_path), capture_output=True, text=True, timeout=300,
      env=script_env())
  assert result.returncode == 0, result.stderr[-2000:]
