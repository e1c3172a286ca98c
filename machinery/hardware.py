"""Chooses where the towers go, and tells what this machine's devices can run.

tower_devices() chooses a device for each tower of the multi-GPU and
distributed trainers: a GPU each, virtual GPUs split from GPU 0
(--virtual_gpus), or the CPU; all_reduce_between() which collective
averages their gradients when each keeps its own variables.
session_config() makes the ConfigProto every script's sessions start from;
grow_gpu_memory() lets a process that shares a GPU with its own children
take the GPU's memory only as it needs it.
precision_notice() says when --use_fp16 or --use_bf16 will be slow here
(a CPU without bfloat16 units, a GPU without tensor cores for it), and
nchw_runs_here() whether --data_format=NCHW can run (GPUs, or
TensorFlow's oneDNN on the CPU).
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import functools
import os

from machinery import environment
from machinery import errors
import tensorflow as tf

tf1 = tf.compat.v1
flags = tf1.flags

flags.DEFINE_boolean('virtual_gpus', False,
                     'With fewer GPUs than the trainer needs devices (a tower '
                     'each, or a part of the model each), split GPU 0 into '
                     'that many virtual GPUs, which share its memory; without '
                     'a GPU, give each its own virtual CPU device /cpu:i '
                     'instead of all /cpu:0.')

# GPUs from this compute capability on have bfloat16 tensor cores (Ampere).
BF16_GPU_CAPABILITY = (8, 0)

# GPUs from this compute capability on have float16 tensor cores (Volta).
FP16_GPU_CAPABILITY = (7, 0)

# The memory of each virtual GPU split_gpu_for_process makes, in MB: a
# tower of 128 needs a few hundred; every GPU has twice this.
VIRTUAL_GPU_MB = 2048


def split_gpu_for_process(num_devices):
  """Splits GPU 0 into num_devices virtual GPUs for the whole process, as
  --virtual_gpus splits it for a script's session, where there are fewer
  GPUs than num_devices; does nothing otherwise (no GPU: tower_devices
  makes virtual CPU devices per session).

  A process sets a GPU's devices up once, at its first op or session, and
  then fails a session that asks for another split. A notebook runs many
  sessions and eager ops in one process: it calls this before any of them,
  and gives every session tower_devices(num_devices, True)'s config.
  """
  gpus = tf.config.list_physical_devices('GPU')
  if gpus and len(gpus) < num_devices:
    tf.config.set_logical_device_configuration(gpus[0], [
        tf.config.LogicalDeviceConfiguration(memory_limit=VIRTUAL_GPU_MB)
        for _ in range(num_devices)])


def grow_gpu_memory():
  """Makes every GPU allocator of this process, and of the processes it
  starts (they inherit its environment), take memory as it needs it,
  whatever the first session or eager op to make the devices asked for;
  returns nothing. Call it before the first session or op.

  A session's allow_growth alone was not enough for benchmark.py on an
  H100: with TF_FORCE_GPU_ALLOW_GROWTH set only for the Keras rows'
  children, its split_bf16 child could not open the GPU ("cudaSetDevice()
  on GPU:0 failed. Status: out of memory"; the card's memory was gone to
  the parent or a child started before it); set in the parent, which every
  child inherits, every row ran (docs/gpu.md).
  """
  os.environ['TF_FORCE_GPU_ALLOW_GROWTH'] = 'true'


def session_config(num_gpus=1):
  """Makes the ConfigProto of every script's sessions.

  Soft placement; the first num_gpus GPUs only, so that a script of one
  tower (train, eval, predict) opens one GPU, not every GPU of the machine
  (CUDA_VISIBLE_DEVICES chooses which are first); GPU memory taken as it
  is needed rather than all of it up front, so that a trainer, the
  evaluator and cifar10_predict.py share a GPU.

  Args:
    num_gpus: how many GPUs the sessions use.

  Returns:
    A tf.compat.v1.ConfigProto.
  """
  config = tf1.ConfigProto(allow_soft_placement=True)
  config.gpu_options.allow_growth = True
  num_visible = len(tf.config.list_physical_devices('GPU'))
  if num_visible > num_gpus:
    config.gpu_options.visible_device_list = ','.join(
        str(i) for i in range(num_gpus))
  return config


def tower_devices(num_towers, virtual=False, what='tower'):
  """Chooses a device for each tower (or each part of a split model).

  One GPU per tower where there are enough GPUs. With fewer GPUs and
  virtual, GPU 0 is split into num_towers virtual GPUs, sharing its
  memory; without a GPU, virtual gives tower i its own virtual CPU device
  /cpu:i, and otherwise all towers share /cpu:0.

  Args:
    num_towers: number of towers (--num_gpus).
    virtual: --virtual_gpus: split a device when there are too few.
    what: what runs on each device, for the lines that say where.

  Returns:
    devices: list of num_towers device names.
    config: the tf.compat.v1.ConfigProto for the session, which makes them.

  Raises:
    errors.UsageError: more towers than GPUs, and not virtual.
  """
  num_visible = len(tf.config.list_physical_devices('GPU'))
  devices = ['/gpu:%d' % i for i in range(num_towers)]
  if num_visible >= num_towers:
    return devices, session_config(num_towers)
  config = session_config()
  if num_visible and virtual:
    config.gpu_options.visible_device_list = '0'
    config.gpu_options.experimental.num_virtual_devices_per_gpu = num_towers
    print('--virtual_gpus: %d GPU(s) visible, so GPU 0 is split into %d '
          'virtual GPUs, /gpu:0 to /gpu:%d, which share its memory and its '
          'cores.' % (num_visible, num_towers, num_towers - 1))
    return devices, config
  if num_visible and what == 'tower':
    raise errors.UsageError(
        '--num_gpus=%d, but only %d GPU(s) are visible. Use --num_gpus=%d '
        'or less, or add --virtual_gpus to split GPU 0 into %d virtual '
        'GPUs.' % (num_towers, num_visible, num_visible, num_towers))
  if num_visible:
    raise errors.UsageError(
        'The %d %ss need a GPU each, but only %d GPU(s) are visible. Add '
        '--virtual_gpus to split GPU 0 into %d virtual GPUs.'
        % (num_towers, what, num_visible, num_towers))
  config.device_count['GPU'] = 0
  if virtual:
    config.device_count['CPU'] = num_towers
    print('No GPU found: running the %d %s(s) on the CPU, %s i on virtual '
          'CPU device /cpu:i (they share its cores).'
          % (num_towers, what, what))
    return ['/cpu:%d' % i for i in range(num_towers)], config
  print('No GPU found: running the %d %s(s) on the CPU.' % (num_towers, what))
  return ['/cpu:0'] * num_towers, config


def all_reduce_between(devices, gpus_shared=False):
  """Chooses the collective that averages the gradients of towers on devices.

  NCCL where every tower has a GPU of its own; TensorFlow's ring
  otherwise: on CPUs, and between virtual GPUs of one card or GPUs that
  workers share, where NCCL refuses to run ("Duplicate GPU detected").
  TensorFlow's own MirroredStrategy makes the same choice.

  Args:
    devices: the towers' devices (of this process).
    gpus_shared: other processes' towers run on these GPUs too (workers
      sharing a machine that has too few GPUs for one each).

  Returns:
    ('nccl' or 'ring', the communication_hint of the collective; a line
    that says which runs, and why).
  """
  specs = [tf.DeviceSpec.from_string(d) for d in devices]
  if any(spec.device_type != 'GPU' for spec in specs):
    return 'ring', ("All-reduce: TensorFlow's ring between the towers' "
                    "devices.")
  gpus = sorted({spec.device_index or 0 for spec in specs})
  num_physical = len(tf.config.list_physical_devices('GPU'))
  if num_physical < len(gpus):
    return 'ring', ("All-reduce: TensorFlow's ring, not NCCL: the towers' "
                    "GPUs are %d virtual GPUs of %d card(s), and NCCL needs "
                    "a card for each." % (len(gpus), num_physical))
  if gpus_shared:
    return 'ring', ("All-reduce: TensorFlow's ring, not NCCL: workers on "
                    "this machine share its GPUs, and NCCL needs a GPU for "
                    "each tower.")
  return 'nccl', 'All-reduce: NCCL between GPUs %s.' % ', '.join(
      str(i) for i in gpus)


def describe_gpus():
  """Names each visible GPU, with its compute capability.

  Returns:
    A list of ('GPU:i (name, compute capability x.y)', (x, y)).
  """
  described = []
  for i, gpu in enumerate(tf.config.list_physical_devices('GPU')):
    details = tf.config.experimental.get_device_details(gpu)
    capability = tuple(details.get('compute_capability') or (0, 0))
    described.append(('GPU:%d (%s, compute capability %d.%d)' % (
        (i, details.get('device_name', 'unknown')) + capability), capability))
  return described


def _cpu_has_bf16_units():
  """Returns whether this CPU has bfloat16 units (AVX512_BF16 or AMX)."""
  return bool(environment.cpu_flags() & {'avx512_bf16', 'amx_bf16'})


def _gpus_before(capability):
  """Returns the visible GPUs of a compute capability below capability,
  described as describe_gpus() describes them."""
  return [gpu for gpu, its in describe_gpus() if its < capability]


def precision_notice(use_fp16, use_bf16):
  """Says when a chosen mixed precision will be slow here.

  Args:
    use_fp16: --use_fp16.
    use_bf16: --use_bf16.

  Returns:
    A line starting 'Note:', or None.
  """
  gpus = tf.config.list_physical_devices('GPU')
  if use_fp16 and not gpus:
    return ('Note: --use_fp16 is meant for GPUs; CPUs compute float16 '
            'convolutions many times slower than float32.')
  if use_fp16:
    slow = _gpus_before(FP16_GPU_CAPABILITY)
    if slow:
      return ('Note: --use_fp16 on %s: GPUs before compute capability %d.%d '
              '(Volta) have no float16 tensor cores, so it may run no faster '
              'than float32.' % ((', '.join(slow),) + FP16_GPU_CAPABILITY))
  if not use_bf16:
    return None
  if not gpus and not _cpu_has_bf16_units():
    return ('Note: --use_bf16 on a machine with neither bfloat16 CPU units '
            '(avx512_bf16, amx_bf16) nor a GPU: it will run slower than '
            'float32.')
  slow = _gpus_before(BF16_GPU_CAPABILITY)
  if slow:
    return ('Note: --use_bf16 on %s: GPUs before compute capability %d.%d '
            'have no bfloat16 tensor cores, so it will run slower than '
            'float32; --use_fp16 is the fast mixed precision there.'
            % ((', '.join(slow),) + BF16_GPU_CAPABILITY))
  return None


@functools.lru_cache(maxsize=None)
def nchw_runs_here():
  """Tells whether the model can run channels-first (NCHW) on this machine.

  GPUs can. TensorFlow's own CPU kernels pool channels-last only; with
  oneDNN (on by default only on CPUs with AVX512_VNNI, AVX512_BF16 or
  AMX) the CPU pools NCHW too. Tried once, on the CPU, in a graph and
  session of its own.
  """
  if tf.config.list_physical_devices('GPU'):
    return True
  with tf.Graph().as_default():
    pool = tf.nn.max_pool2d(tf.zeros([1, 1, 4, 4]), 3, 2, 'SAME',
                            data_format='NCHW')
    try:
      with tf1.Session(config=tf1.ConfigProto(
          device_count={'GPU': 0})) as sess:
        sess.run(pool)
    except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError):
      return False
  return True
