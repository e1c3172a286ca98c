"""Tells, before the first step, whether one step fits in this machine's memory.

A batch too large for the memory ends, on a CPU, with the kernel's OOM
killer: 'Killed', no word of what happened. So each trainer asks first:

  memory.check_step_fits(cifar10, batch_size=8192, towers=1)

which estimates what a step needs and compares it with what the process
may still take, and raises errors.OutOfMemoryError, naming the largest
batch that fits, where it would not fit. The estimate, in bytes:

  now + RUNTIME + input buffers + towers alive x batch x per example

- now: this process's resident memory (TensorFlow loaded);
- RUNTIME: the session, the graph and oneDNN's caches, measured;
- the input's buffers: the shuffle buffer of raw records and the batches
  made ahead (cifar10_input.buffered_bytes);
- per example: every tensor the model's forward pass makes for one
  example (its layer shapes, counted off the graph), kept for the
  backward pass, and the gradient of the largest of them (conv1's
  24x24x64), which the backward pass makes while they are still held;
  the other gradients come as the kept tensors go. 4 bytes each, the
  model counted in float32: measured on a CPU with AMX, a bfloat16 step
  peaks as high as a float32 one (batch 4096: 3.62 against 3.66 GB);
- towers alive: TensorFlow runs as many towers' steps at once as it has
  threads between ops (one per core), so on a 2-core CPU two towers'
  activations are held at once, not all eight. Which towers' ops run side
  by side is the executor's choice: measured, four towers of 512 on 2
  cores held 1.6 to 2.0 towers' activations, and once 2.9 (AVX2, in CI
  beside another test), where this estimate fell 18% under the peak;
  two towers of 1,024 once held 1.49 (CI), where it stood 20% over.

What the process may take is the memory available (MemAvailable), or less
where a memory cgroup limits it (containers, Colab, Kubernetes): its limit
less what the cgroup uses, page cache it can reclaim aside. On a GPU the
activations live in the GPU's memory, and a step too large for it stops
with one line (out_of_memory_error).
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import os
import re

from machinery import errors
import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1

# What the session adds to the resident memory at a batch of 0: the graph,
# the runtime's threads and pools, oneDNN's caches (cifar10_train.py on a
# 2-core CPU: peak 845 MB at batch 128 with 590 MB resident before the
# graph, less the input and 128 examples' activations).
RUNTIME_BYTES = 150 * 2 ** 20
# Bytes held per activation element, float32 or bfloat16 (see above).
ACTIVATION_BYTES = 4
# The share of the room the batch a refusal names leaves unused: the
# estimate can fall a few percent under a step's real peak, and a peak
# jumps at some batches (a 3 GB cgroup, cifar10_train.py on an AMX CPU:
# 2.37 GB at 3,000 and 3,100, 2.89 GB at 3,200, the limit at 3,580).
SPARE = 0.15
_GB = 2.0 ** 30
# Ops whose outputs share their input's memory (a cond's Switch and Merge
# in TF1's control flow, which the sparsity summaries use), uncounted.
_ALIASES = ('Reshape', 'Identity', 'Switch', 'Merge', 'Squeeze',
            'ExpandDims')


def activation_elements(model):
  """Counts the elements a step holds at its peak for one example: every
  tensor the forward pass makes (the outputs of the ops model's inference
  and loss add), and once more the largest of them, for its gradient.

  Args:
    model: the model's module, cifar10: its inference, loss and IMAGE_SIZE.

  Returns:
    The count, an int.
  """
  # Counted in float32 whatever the precision: measured on CPUs, a step in
  # bfloat16 peaks as high as one in float32 (see above).
  size = model.IMAGE_SIZE
  with tf.Graph().as_default() as graph:
    images = tf1.placeholder(tf.float32, [1, size, size, 3])
    labels = tf1.placeholder(tf.int32, [1])
    before = set(graph.get_operations())
    model.loss(model.inference(images), labels)  # Their defaults: float32.
    sizes = [0]
    for op in graph.get_operations():
      if op in before or op.type in _ALIASES:
        continue
      sizes += [int(np.prod(t.shape)) for t in op.outputs
                if t.dtype.is_floating and t.shape.is_fully_defined() and
                t.shape.ndims and t.shape[0] == 1]
  return sum(sizes) + max(sizes)


def towers_alive(towers):
  """Returns how many towers hold their activations at once on this CPU:
  one per core TensorFlow runs ops on side by side."""
  return min(towers, len(os.sched_getaffinity(0)) if hasattr(
      os, 'sched_getaffinity') else os.cpu_count() or 1)


def tower_bytes(per_example, batch_size):
  """Returns the bytes of one tower's activations for a batch: per_example
  (activation_elements) floats an image."""
  return batch_size * per_example * ACTIVATION_BYTES


def step_bytes(model, per_example, batch_size, towers):
  """Returns the bytes a step adds to the process: runtime, the input's
  buffers (model.buffered_bytes) and the activations of the towers alive
  at once."""
  return (RUNTIME_BYTES + model.buffered_bytes(batch_size, towers) +
          towers_alive(towers) * tower_bytes(per_example, batch_size))


def resident_bytes():
  """Returns this process's resident memory, in bytes (Linux), or 0."""
  try:
    with open('/proc/self/status') as f:
      match = re.search(r'^VmRSS:\s+(\d+) kB', f.read(), re.M)
  except OSError:
    return 0
  return int(match.group(1)) * 1024 if match else 0


def _read_number(path):
  """Returns the number in a file, or None (absent, 'max', unreadable)."""
  try:
    with open(path) as f:
      text = f.read().strip()
  except OSError:
    return None
  return int(text) if text.isdigit() else None


def _reclaimable(stat_path, key):
  """Returns the page cache a cgroup can give back (its memory.stat's
  inactive file pages), or 0."""
  try:
    with open(stat_path) as f:
      match = re.search(r'^%s (\d+)$' % key, f.read(), re.M)
  except OSError:
    return 0
  return int(match.group(1)) if match else 0


def _cgroup_room(root, relative, limit_file, usage_file, inactive_key):
  """Returns the least room (limit less unreclaimable usage) over a cgroup
  and its parents, with where it is, or (None, None) with no limit."""
  room, where = None, None
  path = relative.strip('/')
  while True:
    directory = os.path.join(root, path)
    limit = _read_number(os.path.join(directory, limit_file))
    usage = _read_number(os.path.join(directory, usage_file))
    # Unlimited reads as a huge number in cgroup v1: anything above 2^60.
    if limit is not None and usage is not None and limit < 2 ** 60:
      free = limit - usage + _reclaimable(
          os.path.join(directory, 'memory.stat'), inactive_key)
      if room is None or free < room:
        room, where = free, (directory, limit)
    if not path:
      return room, where
    path = os.path.dirname(path)


def cgroup_room(proc_cgroup='/proc/self/cgroup', root='/sys/fs/cgroup'):
  """Returns (bytes this process's memory cgroups leave it, (the cgroup's
  directory, its limit)), or (None, None) where none limits it."""
  try:
    with open(proc_cgroup) as f:
      lines = f.read().splitlines()
  except OSError:
    return None, None
  for line in lines:
    _, controllers, relative = line.split(':', 2)
    if 'memory' in controllers.split(','):  # cgroup v1.
      return _cgroup_room(os.path.join(root, 'memory'), relative,
                          'memory.limit_in_bytes', 'memory.usage_in_bytes',
                          'total_inactive_file')
  for line in lines:
    if line.startswith('0::'):  # cgroup v2, unified.
      for base in (root, os.path.join(root, 'unified')):
        if os.path.exists(os.path.join(base, 'cgroup.controllers')):
          return _cgroup_room(base, line[3:], 'memory.max',
                              'memory.current', 'inactive_file')
  return None, None


def available_bytes():
  """Returns (the bytes this process may still take, what limits it: a
  phrase)."""
  available = None
  with open('/proc/meminfo') as f:
    match = re.search(r'^MemAvailable:\s+(\d+) kB', f.read(), re.M)
  if match:
    available = int(match.group(1)) * 1024
  room, where = cgroup_room()
  if room is not None and (available is None or room < available):
    return room, 'the limit of its memory cgroup, %.1f GB (%s)' % (
        where[1] / _GB, where[0])
  return available, 'the memory available on this machine'


def check_step_fits(model, batch_size, towers):
  """Stops, with one line, a trainer whose step would not fit in memory.

  Args:
    model: the model's module, cifar10: its inference, loss, IMAGE_SIZE
      and buffered_bytes.
    batch_size: --batch_size, the examples of one tower.
    towers: the towers a step runs (on this CPU).

  Raises:
    errors.OutOfMemoryError: the estimate is above what the process may
      take; it names the largest batch that fits with SPARE of the room
      left unused.
  """
  if tf.config.list_physical_devices('GPU') or not os.path.exists(
      '/proc/meminfo'):
    return  # The activations go to the GPU; or not Linux: no reading.
  per_example = activation_elements(model)
  need = step_bytes(model, per_example, batch_size, towers)
  room, limited_by = available_bytes()
  if room is None or need <= room:
    return
  fixed = step_bytes(model, per_example, 0, towers)
  per_batch = step_bytes(model, per_example, 1, towers) - fixed
  largest = int(((1 - SPARE) * room - fixed) // per_batch)
  raise errors.OutOfMemoryError(
      'One step of %d tower%s of --batch_size=%d needs about %.1f GB of '
      'memory more than the %.1f GB this process holds now (an estimate), '
      'and only %.1f GB more are available: %s. %s' % (
          towers, 's' if towers > 1 else '', batch_size, need / _GB,
          resident_bytes() / _GB, room / _GB, limited_by,
          'The largest batch that fits, with %d%% to spare for the '
          'estimate\'s error, is %d: lower --batch_size%s.' % (
              100 * SPARE, largest, ' or --num_gpus' if towers > 1 else '')
          if largest >= 1 else 'Not even a batch of 1 fits: free memory.'))
