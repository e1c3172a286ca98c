"""Shared fixtures: the real CIFAR-10 archive, small fake data, script runs.

The real data is found through the environment variable CIFAR10_ARCHIVE,
which defaults to ../shared/data/cifar-10-binary.tar.gz beside the
repository. Tests that need it skip with a reason when it is absent,
except under CI (CI=true), where its absence is a failure.
"""

import gc
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

# Float32 is float32 in the tests, on GPUs too: Ampere and later GPUs
# multiply float32 matrices in TF32 (a 10-bit mantissa) by default, which
# the tests' exact comparisons would not survive. The variable reaches
# cuBLAS and cuDNN in this process and in every script a test runs.
os.environ.setdefault('NVIDIA_TF32_OVERRIDE', '0')
# GPU memory grows as it is needed in this process and in every script a
# test runs, whatever their session configs (Keras' eager runs have none),
# so that the tests running two at a time and the scripts they start
# share a GPU instead of the first process taking nearly all of it.
os.environ.setdefault('TF_FORCE_GPU_ALLOW_GROWTH', 'true')

import cifar10  # pylint: disable=g-import-not-at-top,wrong-import-position
import cifar10_input  # pylint: disable=g-import-not-at-top,wrong-import-position

# The model's functions read no flag: the flags stay unparsed, as in a
# notebook, but where a test runs a script's own code (parsed_flags).
cifar10.tf.config.experimental.enable_tensor_float_32_execution(False)

# Why the GPU tests are skipped here, or None where TensorFlow sees a GPU.
NO_GPU = (None if cifar10.tf.config.list_physical_devices('GPU') else
          'TensorFlow sees no GPU on this machine')


def pytest_collection_finish(session):  # pylint: disable=unused-argument
  """Freezes what the test modules imported (TensorFlow), as cli.run_main
  does in a script: Python's collector then skips it at each full
  collection, which the tests' graphs set off often, and at exit."""
  gc.freeze()


ARCHIVE = os.environ.get(
    'CIFAR10_ARCHIVE',
    os.path.join(REPO, '..', 'shared', 'data', 'cifar-10-binary.tar.gz'))
ARCHIVE_MD5 = '4d63be8d021c62e4bc3219dd0b04a092'

STEP_LINE = re.compile(
    r'^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: step (\d+), loss = (\d+\.\d\d) '
    r'\((\d+\.\d) examples/sec; (\d+\.\d{3}) sec/batch\)$', re.M)


@pytest.fixture(scope='session')
def real_data_dir(tmp_path_factory):
  """A data_dir with the real CIFAR-10 extracted into it."""
  if not os.path.exists(ARCHIVE):
    message = ('real CIFAR-10 archive not found at %s (set CIFAR10_ARCHIVE)'
               % ARCHIVE)
    if os.environ.get('CI') == 'true':
      pytest.fail(message)
    pytest.skip(message)
  data_dir = tmp_path_factory.mktemp('cifar10_data')
  with tarfile.open(ARCHIVE, 'r:gz') as tar:
    tar.extractall(data_dir, filter='data')
  return str(data_dir)


def write_records(path, labels, images):
  """Writes CIFAR-10 binary records.

  Args:
    path: file to write.
    labels: sequence of ints.
    images: uint8 array [n, 32, 32, 3] (height, width, depth).
  """
  with open(path, 'wb') as f:
    for label, image in zip(labels, images):
      f.write(bytes([label]))
      f.write(np.transpose(image, [2, 0, 1]).astype(np.uint8).tobytes())


def make_fake_data(data_dir, records_per_file=20, seed=0):
  """Writes small random train and test files in the CIFAR-10 layout.

  Returns:
    dict file name -> (labels, images).
  """
  rng = np.random.RandomState(seed)
  batches_dir = os.path.join(data_dir, cifar10_input.BATCHES_DIR)
  os.makedirs(batches_dir, exist_ok=True)
  written = {}
  for name in cifar10_input.TRAIN_FILES + cifar10_input.TEST_FILES:
    labels = rng.randint(0, 10, size=records_per_file)
    images = rng.randint(0, 256, size=(records_per_file, 32, 32, 3))
    write_records(os.path.join(batches_dir, name), labels, images)
    written[name] = (labels, images)
  return written


@pytest.fixture
def parsed_flags():
  """The flags parsed at their defaults, as a script's main() finds them
  (flagsaver sets others); unparsed again after the test."""
  flags = cifar10.tf.compat.v1.flags.FLAGS
  flags(['test'])
  yield flags
  flags.unparse_flags()


@pytest.fixture
def cpu_only(monkeypatch):
  """Hides any GPU from the code under test, as on a machine without one.

  The scripts' device choices then build for the CPU (the towers' devices,
  the layout), and every tf.compat.v1.Session the test makes runs on the
  CPU alone, whatever its config says.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  real = tf.config.list_physical_devices
  monkeypatch.setattr(
      tf.config, 'list_physical_devices',
      lambda device_type=None: [] if device_type == 'GPU'
      else real(device_type))

  class CpuSession(tf.compat.v1.Session):

    def __init__(self, target='', graph=None, config=None):
      pinned = tf.compat.v1.ConfigProto()
      if config is not None:
        pinned.CopyFrom(config)
      pinned.device_count['GPU'] = 0
      super(CpuSession, self).__init__(target, graph, pinned)
  monkeypatch.setattr(tf.compat.v1, 'Session', CpuSession)


@pytest.fixture
def fake_data_dir(tmp_path):
  """A data_dir with small random data in the CIFAR-10 layout."""
  make_fake_data(str(tmp_path))
  return str(tmp_path)


# A directory whose sitecustomize.py hides from a script what the tests'
# machine has beyond requirements.txt, as a user's install would not have
# it (tests/runtime_only/sitecustomize.py says why).
RUNTIME_ONLY = os.path.join(REPO, 'tests', 'runtime_only')


def script_env(env=None):
  """Returns env (None: this process's environment) with RUNTIME_ONLY first
  on PYTHONPATH: the environment of a script a test runs."""
  env = dict(os.environ if env is None else env)
  env['PYTHONPATH'] = os.pathsep.join(
      [RUNTIME_ONLY] + [p for p in [env.get('PYTHONPATH')] if p])
  return env


def run_script(script, *args, timeout=600, env=None):
  """Runs one of the repository's scripts, with script_env(env); returns
  the CompletedProcess."""
  return subprocess.run(
      [sys.executable, os.path.join(REPO, script)] + list(args),
      cwd=REPO, capture_output=True, text=True, timeout=timeout,
      env=script_env(env))


def train(data_dir, train_dir, *args, script='cifar10_train.py', **kwargs):
  """Runs a trainer (cifar10_train.py unless script says) on data_dir into
  train_dir, with more flags in args; returns the CompletedProcess."""
  return run_script(script, '--data_dir=' + data_dir,
                    '--train_dir=' + train_dir, *args, **kwargs)


def trained_run(tmp_path_factory, data_dir, *args):
  """Trains cifar10_train.py with args into a new directory, which it
  returns once the run has succeeded."""
  train_dir = str(tmp_path_factory.mktemp('trained') / 'run')
  result = train(data_dir, train_dir, *args)
  assert result.returncode == 0, result.stderr[-3000:]
  return train_dir


def evaluate(data_dir, checkpoint_dir, eval_dir, *args, **kwargs):
  """Runs cifar10_eval.py --run_once on checkpoint_dir, writing to eval_dir,
  with more flags in args (which may undo --run_once); returns the
  CompletedProcess."""
  return run_script('cifar10_eval.py', '--run_once', '--data_dir=' + data_dir,
                    '--checkpoint_dir=' + checkpoint_dir,
                    '--eval_dir=' + str(eval_dir), *args, **kwargs)


# Runs a script with writes limited to argv[1] bytes per file, as a full
# disk fails them (EFBIG, SIGXFSZ ignored).
LIMITED = """
import resource, runpy, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]),) * 2)
sys.argv = sys.argv[2:]
sys.path.insert(0, %r)
runpy.run_path(sys.argv[0], run_name='__main__')
""" % REPO


def run_limited(limit, script, *args, merge_output=False):
  """Runs a script as a full disk would let it: no file over limit bytes.

  Args:
    limit: the most bytes a file may have.
    script: the script, relative to the repository.
    *args: its arguments.
    merge_output: stderr into stdout, in the order written, as on a
      terminal.

  Returns:
    The CompletedProcess.
  """
  return subprocess.run(
      [sys.executable, '-c', LIMITED, str(limit), script] + list(args),
      cwd=REPO, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT if merge_output else subprocess.PIPE,
      text=True, timeout=600, env=script_env())


def _default_sigint():
  # As in a terminal: a test run started in the background ('cmd &' in a
  # script) ignores SIGINT, and Python keeps an ignored SIGINT ignored.
  signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_script(script, *args, env=None):
  """Starts one of the repository's scripts in the background, as from a
  terminal (SIGINT at its default).

  Its stdout and stderr are read as they come, so that waits keep their
  deadlines and no pipe fills: process.out and process.err are LineReaders.

  Args:
    script: the script, relative to the repository.
    *args: its arguments.
    env: its environment (None: this one's), through script_env.

  Returns:
    The Popen, with .out and .err.
  """
  process = subprocess.Popen(
      [sys.executable, os.path.join(REPO, script)] + list(args), cwd=REPO,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      env=script_env(env),
      preexec_fn=_default_sigint)
  process.out, process.err = LineReader(process.stdout), LineReader(
      process.stderr)
  return process


class LineReader(object):
  """Reads a stream (a process's stdout or stderr) in a thread of its own,
  so that a test waits for a line with a deadline that holds even when
  the process goes quiet.

  Attributes:
    lines: every line read so far.
  """

  def __init__(self, stream):
    self.lines = []
    self._ended = False
    self._queue = queue.Queue()
    threading.Thread(target=self._read, args=(stream,), daemon=True).start()

  def _read(self, stream):
    for line in iter(stream.readline, ''):
      self._queue.put(line)
    self._queue.put(None)

  def _next(self, deadline):
    """The next line, or None at the end; AssertionError at the deadline."""
    if self._ended:
      return None
    try:
      line = self._queue.get(timeout=max(deadline - time.time(), 0))
    except queue.Empty:
      raise AssertionError('no line in time; so far:\n' +
                           ''.join(self.lines[-20:]))
    if line is None:
      self._ended = True
    else:
      self.lines.append(line)
    return line

  def wait_for(self, pattern, timeout):
    """Returns the match of the next line that matches pattern.

    Raises:
      AssertionError: none within timeout seconds, or the stream ended.
    """
    deadline = time.time() + timeout
    while True:
      line = self._next(deadline)
      if line is None:
        raise AssertionError('ended with no line matching %r:\n%s'
                             % (pattern, ''.join(self.lines[-20:])))
      match = re.search(pattern, line)
      if match:
        return match

  def text(self, timeout=60):
    """All the stream's text, once it has ended (within timeout)."""
    deadline = time.time() + timeout
    while self._next(deadline) is not None:
      pass
    return ''.join(self.lines)


def build_towers(batches, devices, variable_update, opts=None,
                 measure_noise=True):
  """The multi-GPU trainer's towers on given batches and devices, in either
  way of sharing the variables, built under /cpu:0 as its build_graph
  builds them, on the tutorial's recipe and opts (None: the defaults).

  Returns:
    (train_op, the last tower's loss, the scaffold).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import cifar10_multi_gpu_train as multi  # pylint: disable=g-import-not-at-top
  import cifar10_replicated  # pylint: disable=g-import-not-at-top
  from machinery import options  # pylint: disable=g-import-not-at-top
  from machinery import recipe  # pylint: disable=g-import-not-at-top
  build = (cifar10_replicated.builder(devices, multi.tower_loss)
           if variable_update == cifar10_replicated.REPLICATED
           else multi.build_train_op)
  with tf.device('/cpu:0'):
    return build(batches, devices, recipe.TUTORIAL, opts or options.DEFAULT,
                 measure_noise)


def script_graph(train_dir, functions=False):
  """{op name: op type} of the graph.pbtxt a trainer wrote to train_dir;
  with functions, of the ops in its functions instead (tf.data's map
  functions: the input's preprocessing)."""
  from google.protobuf import text_format  # pylint: disable=g-import-not-at-top
  from tensorflow.core.framework import graph_pb2  # pylint: disable=g-import-not-at-top
  graph = graph_pb2.GraphDef()
  with open(os.path.join(train_dir, 'graph.pbtxt')) as f:
    text_format.Parse(f.read(), graph)
  if functions:
    return {node.name: node.op for function in graph.library.function
            for node in function.node_def}
  return {node.name: node.op for node in graph.node}


def checkpoint_step(train_dir):
  """Global step of the latest checkpoint in train_dir, or None."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  path = tf.train.latest_checkpoint(train_dir)
  if path is None:
    return None
  return int(tf.train.load_checkpoint(path).get_tensor('global_step'))


def in_use_line(train_dir, pid, args, advice=''):
  """The Error line of a trainer refused a --train_dir that
  cifar10_train.py, run with args as process pid, holds."""
  return ('Error: --train_dir=%s is in use by process %d on %s (%s %s). Wait '
          'for it to end or stop it, or train in another --train_dir.%s'
          % (train_dir, pid, socket.gethostname(),
             os.path.join(REPO, 'cifar10_train.py'), ' '.join(args), advice))


def error_lines(stderr):
  """The lines of ours on stderr, without TensorFlow's start-up logging."""
  return [l for l in stderr.splitlines()
          if l.startswith('Error:')]
