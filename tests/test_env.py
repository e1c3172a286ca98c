"""The environment TensorFlow starts in (machinery/environment.py): oneDNN
on where TensorFlow would leave it off on an x86 CPU, the user's choice
kept."""

import os
import subprocess
import sys

from conftest import REPO
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
                          env=environ, capture_output=True, text=True,
                          timeout=300)
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
