"""Reads the cluster a distributed training task belongs to; starts its server.

Where the tasks are comes from the command line or, without host lists
there, from the TF_CONFIG environment variable that Kubernetes (Kubeflow's
TFJob), Vertex AI and SageMaker give every task:

  TF_CONFIG='{"cluster": {"chief": ["h0:2222"], "worker": ["h1:2222"],
                          "ps": ["h2:2222"]},
              "task": {"type": "worker", "index": 0}}'

A 'chief' task is worker 0, with the chief's duties; the 'worker' tasks
are the workers after it. Task types are read in any case. --job_name and
--task_index given on the command line win over TF_CONFIG's task.

With parameter-server tasks the cluster trains in parameter-server mode;
without, its workers all-reduce their gradients (the distributed trainer's
--variable_update says so, or follows the cluster).

Usage:
  task = cluster.from_flags_or_tf_config()
  print(task.describe(all_reduce))
  server = start_server(task, server_config(task, all_reduce, config))
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import collections
import json
import os
import socket

from machinery import hardware
from machinery import errors
import tensorflow as tf

tf1 = tf.compat.v1
flags = tf1.flags
FLAGS = flags.FLAGS

flags.DEFINE_enum('job_name', None, ['ps', 'worker'],
                  'This task\'s job: ps or worker (or TF_CONFIG\'s task).')
flags.DEFINE_integer('task_index', 0, 'This task\'s index in its job.',
                     lower_bound=0)
flags.DEFINE_list('ps_hosts', [], 'Parameter servers, host:port,...; none: '
                  'the workers all-reduce.')
flags.DEFINE_list('worker_hosts', [], 'Workers, host:port,...; the first '
                  'is the chief. Without host lists: TF_CONFIG\'s cluster.')

# The environment variable cluster managers describe the cluster in.
TF_CONFIG = 'TF_CONFIG'

# TF_CONFIG's task types, and the job each is in here.
TASK_TYPES = ('chief', 'worker', 'ps')

# The task whose collective executor forms the all-reduce groups.
GROUP_LEADER = '/job:worker/replica:0/task:0'

# Seconds to wait for a peer's port to answer, when looking for the dead.
CONNECT_SECS = 2


class Task(collections.namedtuple(
    'Task', ['ps_hosts', 'worker_hosts', 'job_name', 'task_index',
             'source'])):
  """Holds this task and its cluster.

  Attributes:
    ps_hosts: host:port of each ps task.
    worker_hosts: host:port of each worker task; the first is the chief.
    job_name: 'ps' or 'worker'.
    task_index: the task's index in its job.
    source: where the cluster came from, for the start line.
  """

  @property
  def name(self):
    """Names the task: 'worker 1', 'ps 0'."""
    return '%s %d' % (self.job_name, self.task_index)

  @property
  def log_name(self):
    """Starts the task's lines: 'Worker 1', 'ps task 0'."""
    if self.job_name == 'ps':
      return 'ps task %d' % self.task_index
    return 'Worker %d' % self.task_index

  @property
  def is_chief(self):
    """Tells whether the task is worker 0, the chief."""
    return self.job_name == 'worker' and self.task_index == 0

  def address(self, job_name, task_index):
    """Returns the host:port of a task of the cluster."""
    hosts = self.ps_hosts if job_name == 'ps' else self.worker_hosts
    return hosts[task_index]

  def device(self, local_device):
    """Names a device of this task: '/gpu:1' of worker 2 is
    '/job:worker/task:2/device:GPU:1'."""
    return tf.DeviceSpec.from_string(
        '/job:%s/task:%d' % (self.job_name, self.task_index)).make_merged_spec(
            tf.DeviceSpec.from_string(local_device)).to_string()

  def cluster_spec(self):
    """Makes the tf.compat.v1.train.ClusterSpec; a job without tasks is
    left out."""
    jobs = {'worker': list(self.worker_hosts)}
    if self.ps_hosts:
      jobs['ps'] = list(self.ps_hosts)
    return tf1.train.ClusterSpec(jobs)

  def describe(self, all_reduce):
    """Words the start line: this task, the cluster, how its workers share
    the variables (all_reduce or ps tasks), and where it came from."""
    return ('%s of a cluster of %d worker(s) and %d ps task(s), from %s; %s.'
            % (self.name.capitalize(), len(self.worker_hosts),
               len(self.ps_hosts), self.source,
               'every worker holds the variables, gradients are '
               'all-reduced between workers' if all_reduce
               else 'the ps tasks hold the variables'))


def _tf_config_error(what):
  """Makes the UsageError of a TF_CONFIG that says what."""
  return errors.UsageError(
      'TF_CONFIG %s. It should read like {"cluster": {"chief": ["host:port"], '
      '"worker": [...], "ps": [...]}, "task": {"type": "worker", "index": '
      '0}}.' % what)


def _hosts(cluster, task_type):
  """Returns the host:port list of one task type of TF_CONFIG's cluster."""
  hosts = cluster.get(task_type, [])
  if isinstance(hosts, dict):  # Sparse: {"0": "host:port", ...}.
    hosts = [hosts[k] for k in sorted(hosts, key=int)]
  if not isinstance(hosts, list) or not all(
      isinstance(h, str) and is_host_port(h) for h in hosts):
    raise _tf_config_error('cluster "%s" is %s: give a list of host:port '
                           'strings' % (task_type, json.dumps(hosts)))
  return hosts


def is_host_port(address):
  """Returns whether address reads as host:port."""
  host, _, port = address.rpartition(':')
  return bool(host) and port.isdigit() and 0 < int(port) < 65536


for _hosts_flag in ('ps_hosts', 'worker_hosts'):
  flags.register_validator(
      _hosts_flag, lambda hosts: all(is_host_port(h) for h in hosts),
      message='give each task as host:port, the port a number 1-65535')


def parse_tf_config(text):
  """Reads the cluster and this task from TF_CONFIG's text.

  Args:
    text: the JSON of TF_CONFIG.

  Returns:
    (ps_hosts, worker_hosts, job_name, task_index): the chief, if any, is
    worker 0.

  Raises:
    errors.UsageError: malformed or inconsistent, in one line.
  """
  try:
    config = json.loads(text)
  except ValueError as e:
    raise _tf_config_error('is not JSON (%s)' % e)
  if not isinstance(config, dict) or not isinstance(
      config.get('cluster'), dict):
    raise _tf_config_error('has no "cluster" object')
  cluster = {str(k).lower(): v for k, v in config['cluster'].items()}
  unknown = sorted(set(cluster) - set(TASK_TYPES))
  if unknown:
    raise _tf_config_error(
        'cluster has task type(s) %s: this trainer runs chief, worker and ps '
        'tasks (evaluate with cifar10_eval.py beside it)' % ', '.join(unknown))
  chief = _hosts(cluster, 'chief')
  if len(chief) > 1:
    raise _tf_config_error('cluster lists %d chiefs: give one' % len(chief))
  workers = chief + _hosts(cluster, 'worker')
  ps = _hosts(cluster, 'ps')
  if not workers:
    raise _tf_config_error('cluster has neither "chief" nor "worker" tasks')
  task = config.get('task')
  if not isinstance(task, dict) or 'type' not in task:
    raise _tf_config_error('has no "task" object with a "type"')
  task_type = str(task['type']).lower()
  if task_type not in TASK_TYPES:
    raise _tf_config_error('task type is "%s", not one of %s'
                           % (task['type'], ', '.join(TASK_TYPES)))
  index = task.get('index', 0)
  if not isinstance(index, int) or isinstance(index, bool) or index < 0:
    raise _tf_config_error('task index is %s, not a number from 0'
                           % json.dumps(index))
  count = {'chief': len(chief), 'worker': len(workers) - len(chief),
           'ps': len(ps)}[task_type]
  if index >= count:
    raise _tf_config_error('task is %s %d, but the cluster lists %d %s '
                           'task(s)' % (task_type, index, count, task_type))
  if task_type == 'ps':
    return ps, workers, 'ps', index
  return ps, workers, 'worker', index + (len(chief) if task_type == 'worker'
                                         else 0)


def from_flags_or_tf_config():
  """Reads this task and its cluster from the command line or TF_CONFIG.

  The host lists of the command line, if given, are the cluster; else
  TF_CONFIG's. --job_name and --task_index given on the command line win.

  Returns:
    A Task.

  Raises:
    errors.UsageError: no cluster, or a task not in it.
  """
  if FLAGS.ps_hosts or FLAGS.worker_hosts:
    ps, workers = list(FLAGS.ps_hosts), list(FLAGS.worker_hosts)
    job_name, task_index = FLAGS.job_name, FLAGS.task_index
    source = 'the command line'
  elif os.environ.get(TF_CONFIG, '').strip():
    ps, workers, job_name, task_index = parse_tf_config(
        os.environ[TF_CONFIG])
    source = 'TF_CONFIG'
    if FLAGS['job_name'].present or FLAGS['task_index'].present:
      job_name = FLAGS.job_name if FLAGS['job_name'].present else job_name
      task_index = (FLAGS.task_index if FLAGS['task_index'].present
                    else task_index)
      source = 'TF_CONFIG, the task from the command line'
  else:
    raise errors.UsageError(
        'Give the cluster: --worker_hosts=host:port,... (and '
        '--ps_hosts=host:port,... for parameter servers), or set TF_CONFIG.')
  if job_name is None:
    raise errors.UsageError(
        'Give this task\'s job: --job_name=ps or --job_name=worker.')
  if not workers:
    raise errors.UsageError(
        'Give the workers: --worker_hosts=host:port,...')
  hosts = ps if job_name == 'ps' else workers
  if task_index >= len(hosts):
    raise errors.UsageError(
        '--task_index=%d, but --%s_hosts lists %d task(s).'
        % (task_index, job_name, len(hosts)))
  return Task(ps, workers, job_name, task_index, source)


def local_gpus(task, num_gpus, num_visible):
  """Chooses the GPUs of this worker when several workers share its machine.

  Workers with the same host take consecutive blocks of num_gpus GPUs,
  in the order of the worker list, so that none shares a GPU.

  Args:
    task: the worker's Task.
    num_gpus: --num_gpus, towers per worker.
    num_visible: GPUs visible on the machine.

  Returns:
    The visible_device_list for the worker's server ('2,3'), or None when
    it is alone on its machine or there are not GPUs enough for all.
  """
  same_host = _workers_on_its_host(task)
  if len(same_host) < 2 or num_visible < len(same_host) * num_gpus:
    return None
  first = same_host.index(task.task_index) * num_gpus
  return ','.join(str(i) for i in range(first, first + num_gpus))


def take_local_gpus(task, num_gpus, config):
  """Gives a worker that shares its machine with other workers GPUs of its
  own (local_gpus), in config, and says which; else changes nothing.

  Args:
    task: the worker's Task.
    num_gpus: --num_gpus, towers per worker.
    config: the worker's ConfigProto, changed in place.
  """
  gpus = local_gpus(task, num_gpus,
                    len(tf.config.list_physical_devices('GPU')))
  if gpus:
    config.gpu_options.visible_device_list = gpus
    print('Worker %d: GPUs %s of this machine, which it shares with other '
          'workers.' % (task.task_index, gpus))


def gpus_shared(task, num_gpus, num_visible):
  """Tells whether this worker shares its GPUs with other workers of its machine
  (there are too few for local_gpus to give each its own).

  Args as local_gpus's.
  """
  same_host = _workers_on_its_host(task)
  return (len(same_host) > 1 and num_visible > 0 and
          num_visible < len(same_host) * num_gpus)


def _workers_on_its_host(task):
  """Returns the indices of the workers on task's host, in order."""
  host = task.worker_hosts[task.task_index].rpartition(':')[0]
  return [i for i, address in enumerate(task.worker_hosts)
          if address.rpartition(':')[0] == host]


def server_config(task, all_reduce, config):
  """Makes the ConfigProto this task's server starts with.

  A ps task makes no GPU devices (it serves variables from its CPU and
  opens no CUDA context); all-reduce workers name the group leader of
  their collectives (each collective says whether it runs on NCCL).

  Args:
    task: the Task.
    all_reduce: whether the workers all-reduce (no ps tasks).
    config: the worker's ConfigProto (its tower devices); ignored for ps.

  Returns:
    A tf.compat.v1.ConfigProto.
  """
  if task.job_name == 'ps':
    config = hardware.session_config()
    config.device_count['GPU'] = 0
    return config
  config = _copy(config)
  if all_reduce:
    config.experimental.collective_group_leader = GROUP_LEADER
  return config


def session_config(task, all_reduce, config):
  """Makes the ConfigProto of a worker's sessions: its server's, seeing
  itself and the ps tasks (parameter-server mode) only."""
  config = server_config(task, all_reduce, config)
  own = '/job:worker/task:%d' % task.task_index
  config.device_filters.extend([own] if all_reduce else ['/job:ps', own])
  return config


def _copy(config):
  """Returns a copy of a ConfigProto."""
  copied = tf1.ConfigProto()
  copied.CopyFrom(config)
  return copied


def start_server(task, config):
  """Starts this task's gRPC server, and says who can reach it.

  TensorFlow's server listens on the task's port of every network
  interface of the machine (it binds 0.0.0.0, whatever host the cluster
  names, and offers no way to bind fewer), without authentication, and
  runs whatever graph a client sends it: the line it prints says so.

  Returns:
    The tf.distribute.Server.

  Raises:
    errors.UsageError: it cannot listen at its address.
  """
  address = task.address(task.job_name, task.task_index)
  try:
    server = tf1.train.Server(task.cluster_spec(), job_name=task.job_name,
                              task_index=task.task_index, config=config)
  except tf.errors.UnknownError as e:  # gRPC could not bind the address.
    raise errors.UsageError(
        'Cannot start the %s task %d server at %s: %s. Is the port in use, '
        'or the host not this machine?'
        % (task.job_name, task.task_index, address, errors.tf_reason(e)))
  print('%s: its TensorFlow server listens on port %s of every network '
        'interface of this machine, without authentication: anyone who can '
        'reach that port can run anything on this machine as this user. '
        'Keep the cluster on a trusted network (docs/distributed.md, "Who '
        'can reach the servers").'
        % (task.log_name, address.rpartition(':')[2]))
  return server


def unanswered_peers(task):
  """Finds the other workers whose servers do not accept a connection.

  Returns:
    A list of 'worker i (host:port)', in order.
  """
  gone = []
  for i, address in enumerate(task.worker_hosts):
    if i == task.task_index:
      continue
    host, _, port = address.rpartition(':')
    try:
      socket.create_connection((host, int(port)), CONNECT_SECS).close()
    except OSError:
      gone.append('worker %d (%s)' % (i, address))
  return gone


def free_local_ports(n):
  """Finds n distinct free TCP ports on 127.0.0.1, for a cluster whose
  tasks all run on this machine (the tests, docs/cluster_speed.py).

  Returns:
    A list of n port numbers.
  """
  sockets = [socket.socket() for _ in range(n)]
  for s in sockets:
    s.bind(('127.0.0.1', 0))
  ports = [s.getsockname()[1] for s in sockets]
  for s in sockets:
    s.close()
  return ports
