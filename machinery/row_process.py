"""Runs benchmark rows in a child process of other settings, still timed
in turns with the parent's rows.

Some settings are read once, when TensorFlow starts (TF_ENABLE_ONEDNN_OPTS
among them), and a script reads its flags once, as it starts; so a row
that runs under another setting or other flags (--use_bf16, another
--batch_size) needs a process of its own. The parent starts the same
script with --row_process, its own flags and the row's, in an environment
of its own, and talks to it over its stdin and stdout, a line each way:

  parent: setup keras_fit       child: @@ 128 CPU:0   (examples a step,
                                                       devices)
  parent: time keras_fit 50     child: @@ 3.217       (seconds)
  parent: describe              child: @@ on          (what describe()
                                                       says of the child)

The child builds and warms up a row when told, then runs its steps only
when asked, so the rows of every process take turns as the rows of one
would. Lines that do not start with '@@ ' are the child's own output and
are passed over.

  child = RowProcess('benchmark.py', {'TF_ENABLE_ONEDNN_OPTS': '0'},
                     FLAGS.flags_into_string(), ['--use_bf16'])
  timer, examples_per_step, devices = child.setup('keras_fit')
  seconds = timer(50)
  child.close()
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import os
import subprocess
import sys
import tempfile

from machinery import environment
from machinery import errors

# How the child marks its answers among whatever else it prints.
MARK = '@@ '


class RowProcess(object):
  """A child process that sets up and times rows when told."""

  def __init__(self, script, environ, flag_string, extra_flags=()):
    """Starts the child.

    Args:
      script: the script's path; it calls serve() when given --row_process.
      environ: environment variables to set for the child; None removes
        one.
      flag_string: the parent's flags, one a line (FLAGS.flags_into_string).
      extra_flags: flags that the child takes beyond the parent's, and
        over them.
    """
    with tempfile.NamedTemporaryFile('w', suffix='.flags',
                                     delete=False) as f:
      f.write(flag_string)
      self._flagfile = f.name
    env = dict(os.environ)
    for name, value in environ.items():
      if value is None:
        env.pop(name, None)
      else:
        env[name] = value
    self._child = subprocess.Popen(
        [sys.executable, script, '--flagfile=' + self._flagfile] +
        list(extra_flags) + ['--row_process'], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, env=env, text=True, bufsize=1)

  def _ask(self, line):
    """Sends a line; returns the child's answer, without the mark.

    Raises:
      errors.ModelError: the child ended without answering.
    """
    self._child.stdin.write(line + '\n')
    self._child.stdin.flush()
    for answer in self._child.stdout:
      if answer.startswith(MARK):
        return answer[len(MARK):].strip()
    raise errors.ModelError(
        'The child process for "%s" ended (exit status %s) without an '
        'answer; its error is above.' % (line, self._child.wait()))

  def setup(self, row):
    """Builds row in the child and runs its warm-up.

    Returns:
      (timer, examples per step, devices), as the parent's rows: timer(n)
      runs n steps in the child and returns the seconds they took.
    """
    examples_per_step, devices = self._ask('setup ' + row).split()
    def timer(n):
      return float(self._ask('time %s %d' % (row, n)))
    return timer, int(examples_per_step), devices

  def describe(self):
    """Returns what the child's describe() says of it."""
    return self._ask('describe')

  def close(self):
    """Ends the child and removes its flag file."""
    self._child.stdin.close()
    self._child.wait()
    os.remove(self._flagfile)


def onednn_environ(setting):
  """The environment of a child of a oneDNN setting: onednn_on turns
  oneDNN on; tf_default leaves TF_ENABLE_ONEDNN_OPTS to TensorFlow, except
  on the CPUs where the scripts would turn oneDNN on (environment.py):
  there it says what TensorFlow does by itself, off. The GPU, if any, is
  shared with the parent and the other children: each lets its memory
  grow as the parent's environment, which it inherits, says
  (hardware.grow_gpu_memory)."""
  if setting == 'onednn_on':
    onednn = '1'
  elif environment.onednn_setting(environment.cpu_flags(), {}):
    onednn = '0'
  else:
    onednn = None
  return {'TF_ENABLE_ONEDNN_OPTS': onednn}


def start_children(script, settings, flag_string):
  """Starts a child for each (oneDNN setting or None, extra flags) of
  settings; returns {(setting, extra flags): its RowProcess}."""
  return {key: RowProcess(script, onednn_environ(key[0]) if key[0] else {},
                          flag_string, key[1])
          for key in sorted(set(settings), key=str)}


def serve(builders, warmup, describe):
  """The child's side: sets up and times rows as the parent asks, until
  its stdin ends.

  Args:
    builders: {row: a function returning (timer, examples per step,
      devices)}.
    warmup: untimed steps to run after setting a row up.
    describe: returns a word about this process, for the parent.
  """
  timers = {}
  for line in sys.stdin:
    words = line.split()
    if words[0] == 'describe':
      answer = describe()
    elif words[0] == 'setup':
      timer, examples_per_step, devices = builders[words[1]]()
      timer(warmup)
      timers[words[1]] = timer
      answer = '%d %s' % (examples_per_step, devices)
    else:  # time ROW N
      answer = '%.6f' % timers[words[1]](int(words[2]))
    sys.stdout.write(MARK + answer + '\n')
    sys.stdout.flush()
