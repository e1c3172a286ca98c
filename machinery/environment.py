"""Sets the environment TensorFlow starts in, before it is imported.

Importing the machinery package calls set_up(), before any script imports
TensorFlow, so every script starts TensorFlow the same way:

- its C++ start-up chatter is kept off the console (TF_CPP_MIN_LOG_LEVEL
  2: errors still show);
- its oneDNN kernels are on. TensorFlow turns them on by itself only on
  CPUs with AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX; on the x86 CPUs
  without, most laptops and many cloud machines (AVX2), it leaves them
  off, and this model trains about 1.5x slower there (docs/options.md).
  So on such a CPU this module turns them on, unless the user has set
  TF_ENABLE_ONEDNN_OPTS: TF_ENABLE_ONEDNN_OPTS=0 keeps them off.

Nothing here imports TensorFlow.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import os

# The CPU flags on which TensorFlow turns oneDNN on by itself.
ONEDNN_BY_DEFAULT = ('avx512_vnni', 'avx512_bf16', 'avx_vnni', 'amx_tile',
                     'amx_int8', 'amx_bf16')

# The flag of the x86 CPUs whose oneDNN kernels this model gains from.
ONEDNN_GAINS = 'avx2'

# Where Linux lists the CPU's flags.
CPUINFO = '/proc/cpuinfo'


def cpu_flags():
  """Returns the flags of this machine's CPU ('avx2', 'avx512_bf16', ...):
  a set, empty where /proc/cpuinfo does not say."""
  if not os.path.exists(CPUINFO):
    return set()
  with open(CPUINFO) as f:
    return {word for line in f if line.startswith('flags')
            for word in line.split(':', 1)[1].split()}


def cpu_name():
  """Returns the CPU's model name ('AMD EPYC', 'Intel(R) Xeon(R) ...'), or
  'a CPU' where /proc/cpuinfo does not say."""
  if os.path.exists(CPUINFO):
    with open(CPUINFO) as f:
      for line in f:
        if line.startswith('model name'):
          return line.split(':', 1)[1].strip()
  return 'a CPU'


def cpu_class(flags):
  """Names the class of an x86 CPU that decides this model's speed.

  Args:
    flags: the CPU's flags (cpu_flags()).

  Returns:
    'AMX' (bfloat16 tile units), 'AVX512_BF16', 'AVX-512', 'AVX2', or
    what else the flags say.
  """
  if not flags:
    return 'unknown (no %s)' % CPUINFO
  for flag, name in (('amx_bf16', 'AMX'), ('avx512_bf16', 'AVX512_BF16'),
                     ('avx512f', 'AVX-512'), ('avx2', 'AVX2')):
    if flag in flags:
      return name
  return 'without AVX2'


def onednn_by_default(flags):
  """Tells whether TensorFlow turns oneDNN on by itself on this CPU."""
  return bool(flags & set(ONEDNN_BY_DEFAULT))


def onednn_setting(flags, environ):
  """Chooses the TF_ENABLE_ONEDNN_OPTS to start TensorFlow with.

  Args:
    flags: the CPU's flags (cpu_flags()).
    environ: the environment (os.environ).

  Returns:
    '1' where TensorFlow would leave oneDNN off on an x86 CPU that gains
    from it and the user has not chosen; None to leave the choice as it is.
  """
  if 'TF_ENABLE_ONEDNN_OPTS' in environ:
    return None  # The user's choice.
  if ONEDNN_GAINS in flags and not onednn_by_default(flags):
    return '1'
  return None


def set_up(environ=os.environ):
  """Sets TensorFlow's start-up logging and oneDNN in environ.

  Args:
    environ: the environment TensorFlow will read (os.environ).
  """
  environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  onednn = onednn_setting(cpu_flags(), environ)
  if onednn:
    environ['TF_ENABLE_ONEDNN_OPTS'] = onednn
