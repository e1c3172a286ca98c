"""The environment TensorFlow starts in (machinery/environment.py): oneDNN
on where TensorFlow would leave it off on an x86 CPU, the user's choice
kept; and the scripts a test runs, with what a user's install has."""

import ast
import importlib.metadata
import json
import os
import re
import subprocess
import sys

from packaging import requirements

from conftest import REPO, RUNTIME_ONLY, script_env
from machinery import environment

# Whether the TensorFlow of a fresh process has its oneDNN kernels on,
# after importing the machinery package before TensorFlow, as every script
# does.
ONEDNN_ON = """
import machinery
from tensorflow.python.util import _pywrap_util_port
print(_pywrap_util_port.IsMklEnabled())
"""


def test_onednn_is_turned_on_only_where_tensorflow_leaves_it_off():
  avx2 = {'sse4_2', 'avx', 'avx2', 'fma'}
  assert environment.onednn_setting(avx2, {}) == '1'
  # TensorFlow's own choice: on, with any of these.
  for flag in environment.ONEDNN_BY_DEFAULT:
    assert environment.onednn_setting(avx2 | {flag}, {}) is None
  # Not an x86 CPU with AVX2 (an ARM's flags, an old x86).
  assert environment.onednn_setting({'fp', 'asimd'}, {}) is None
  assert environment.onednn_setting({'sse4_2', 'avx'}, {}) is None
  # The user's choice, either way.
  for choice in ('0', '1'):
    assert environment.onednn_setting(
        avx2, {'TF_ENABLE_ONEDNN_OPTS': choice}) is None


def _onednn_on(environ):
  result = subprocess.run([sys.executable, '-c', ONEDNN_ON], cwd=REPO,
                          env=script_env(environ), capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  return result.stdout.split()[-1] == 'True'


def test_scripts_start_tensorflow_with_onednn_unless_told_not_to():
  environ = {k: v for k, v in os.environ.items()
             if k != 'TF_ENABLE_ONEDNN_OPTS'}
  flags = environment.cpu_flags()
  if 'avx2' in flags:  # On by TensorFlow's choice or by ours.
    assert _onednn_on(environ)
  assert not _onednn_on(dict(environ, TF_ENABLE_ONEDNN_OPTS='0'))


def test_cpu_class_names_the_units_that_decide_speed():
  assert environment.cpu_class({'avx2', 'avx512f', 'avx512_bf16',
                                'amx_bf16'}) == 'AMX'
  assert environment.cpu_class({'avx2', 'avx512f', 'avx512_bf16'}) == (
      'AVX512_BF16')
  assert environment.cpu_class({'avx2', 'avx512f'}) == 'AVX-512'
  assert environment.cpu_class({'avx2', 'fma'}) == 'AVX2'
  assert environment.cpu_class({'sse4_2'}) == 'without AVX2'
  assert environment.cpu_class(set()).startswith('unknown')


def _canonical(name):
  """Returns a distribution's name as pip compares names."""
  return re.sub(r'[-_.]+', '-', name).lower()


def _installed_by(requirements_file):
  """The distributions pip installs for requirements_file (its lines and
  what they require in turn, as far as this machine has them), as
  _canonical names."""
  with open(os.path.join(REPO, requirements_file)) as f:
    wanted = [re.split(r'[=<>\[ ;]', line.strip())[0] for line in f
              if line.strip() and not line.startswith(('#', '-'))]
  found = set()
  while wanted:
    name = _canonical(wanted.pop())
    if name in found:
      continue
    found.add(name)
    try:
      needs = importlib.metadata.requires(name) or []
    except importlib.metadata.PackageNotFoundError:
      needs = []  # Not installed here (the GPU kit leaves libclang out).
    for line in needs:
      needed = requirements.Requirement(line)
      if needed.marker is None or needed.marker.evaluate({'extra': ''}):
        wanted.append(needed.name)
  return found


def _not_required():
  """The modules tests/runtime_only/sitecustomize.py hides (read, not run:
  run here, it would hide them from this process)."""
  with open(os.path.join(RUNTIME_ONLY, 'sitecustomize.py')) as f:
    tree = ast.parse(f.read())
  return next(ast.literal_eval(node.value) for node in tree.body
              if isinstance(node, ast.Assign) and
              node.targets[0].id == 'NOT_REQUIRED')


# What a trainer's start imports, as the distributions of the packages a
# child has loaded once it has imported cifar10_train (all of TensorFlow).
STARTED = """
import importlib.metadata, json, sys
import cifar10_train
loaded = {name.partition('.')[0] for name, module in sys.modules.items()
          if module is not None}
owners = importlib.metadata.packages_distributions()
print(json.dumps([dist for name in loaded for dist in owners.get(name, ())]))
"""


def _started(env):
  """Returns the set of distributions a trainer's start loads with env."""
  result = subprocess.run([sys.executable, '-c', STARTED], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  return {_canonical(dist)
          for dist in json.loads(result.stdout.splitlines()[-1])}


def test_scripts_a_test_runs_load_only_what_requirements_install():
  required = _installed_by('requirements.txt')
  owners = importlib.metadata.packages_distributions()
  hidden = {_canonical(dist) for module in _not_required()
            for dist in owners.get(module, ())}
  # The tests' own install has IPython and matplotlib (scipy, where this
  # machine has it); requirements.txt installs none of the hidden ones.
  assert {'ipython', 'matplotlib'} <= hidden
  assert hidden <= _installed_by('requirements-dev.txt') | {'scipy'}
  assert not hidden & required
  # Without the hiding, a trainer's start here loads each hidden one that
  # is installed; with it, nothing from outside requirements.txt.
  assert hidden <= _started(dict(os.environ))
  beyond = _started(script_env()) - required
  assert not beyond, beyond
  for module in _not_required():
    refused = subprocess.run([sys.executable, '-c', 'import ' + module],
                             env=script_env(), capture_output=True, text=True)
    assert refused.returncode == 1
    assert 'ModuleNotFoundError: import of %s halted' % module in (
        refused.stderr)
