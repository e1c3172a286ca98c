"""docs/gpu_kit.sh, which makes ../shared/gpu-kit's kit small enough for a
lent GPU machine: tried on a kit of its layout made of tiny wheels, so it
runs anywhere (the real kit is 800 MB)."""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import io
import os
import shutil
import subprocess
import tarfile
import zipfile

import pytest

from conftest import REPO

# The kit's own install.sh, faked: it unpacks the parts as the real one
# does and records what it found there.
FAKE_INSTALL = '''#!/usr/bin/env bash
set -euo pipefail
cd "$1" && rm -rf x && mkdir x && cat kit.tar.part-* | tar -C x -xf -
ls x/wheels > "$2/wheels_left"
ls x/stubs x/cifar-10-binary.tar.gz > "$2/the_rest"
'''

pytestmark = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ('strip', 'objcopy', 'xz')),
    reason='docs/gpu_kit.sh needs strip and xz; the test, objcopy')
DEBUG_BYTES = 64 << 10  # what strip --strip-unneeded takes off the library


def wheel(directory, name, files):
  """Writes a py3-none-any wheel of name holding files ({path: bytes});
  returns its path."""
  path = os.path.join(directory, '%s-1.0-py3-none-any.whl' % name)
  info = '%s-1.0.dist-info/' % name
  meta = {info + 'METADATA': 'Metadata-Version: 2.1\nName: %s\nVersion: 1.0\n'
                             % name,
          info + 'WHEEL': 'Wheel-Version: 1.0\nGenerator: test\n'
                          'Root-Is-Purelib: true\nTag: py3-none-any\n'}
  with zipfile.ZipFile(path, 'w') as z:
    for member, data in list(files.items()) + list(meta.items()):
      z.writestr(member, data)
    z.writestr(info + 'RECORD', ''.join(
        '%s,,\n' % m for m in list(files) + list(meta) + [info + 'RECORD']))
  return path


def fake_kit(tmp_path):
  """Returns a kit directory in ../shared/gpu-kit's layout: kit.tar.part-*
  holding wheels/ (a 'tensorflow' whose two libraries are real ELF files,
  'six', and a padding wheel of random bytes), stubs/ and the archive; and
  the kit's install.sh."""
  staging = tmp_path / 'staging'
  (staging / 'wheels').mkdir(parents=True)
  (staging / 'stubs').mkdir()
  (staging / 'stubs' / 'libcufft.so.11').write_bytes(b'stub')
  (staging / 'cifar-10-binary.tar.gz').write_bytes(b'the data')
  # A real ELF file with a debug section for strip to take off.
  debug = tmp_path / 'debug'
  debug.write_bytes(os.urandom(DEBUG_BYTES))
  subprocess.run(['objcopy', '--add-section', '.debug_info=%s' % debug,
                  shutil.which('strip'), str(tmp_path / 'elf')], check=True)
  elf = (tmp_path / 'elf').read_bytes()
  wheel(str(staging / 'wheels'), 'tensorflow', {
      'tensorflow/__init__.py': b'',
      'tensorflow/libtensorflow_cc.so.2': elf,
      'tensorflow/libtensorflow_framework.so.2': elf,
      'tensorflow/include/header.h': b'// left out'})
  wheel(str(staging / 'wheels'), 'six', {'six.py': b'x = 1\n'})
  wheel(str(staging / 'wheels'), 'padding',
        {'padding/blob.bin': os.urandom(3 << 20)})
  kit = tmp_path / 'kit'
  kit.mkdir()
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode='w') as tar:
    tar.add(str(staging), arcname='.')
  (kit / 'kit.tar.part-000').write_bytes(buf.getvalue())
  (kit / 'install.sh').write_text(FAKE_INSTALL)
  return kit


def test_the_smaller_kit_installs_its_site_and_runs_the_kits_install(
    tmp_path):
  """The site is installed from the wheels (less TensorFlow's headers, its
  libraries stripped), split into parts of PART_MIB, checked and unpacked
  by install_slim.sh, which then runs the kit's install.sh on the one wheel
  left (six) and the data; a part changed in transit is refused."""
  kit = fake_kit(tmp_path)
  out = tmp_path / 'kit2'
  made = subprocess.run(['bash', 'docs/gpu_kit.sh', str(kit), str(out)],
                        cwd=REPO, env=dict(os.environ, PART_MIB='1'),
                        capture_output=True, text=True, timeout=300)
  assert made.returncode == 0, made.stdout + made.stderr
  parts = sorted(p for p in os.listdir(str(out)) if p.startswith('kit.tar'))
  assert len(parts) >= 3, parts  # 3 MiB of random bytes in parts of 1 MiB
  assert all(os.path.getsize(str(out / p)) <= 1 << 20 for p in parts)

  site = tmp_path / 'site'
  installed = subprocess.run(
      ['bash', str(out / 'install_slim.sh'), str(out), str(site)],
      capture_output=True, text=True, timeout=300)
  assert installed.returncode == 0, installed.stdout + installed.stderr
  library = site / 'tensorflow' / 'libtensorflow_cc.so.2'
  assert library.exists() and (site / 'padding' / 'blob.bin').exists()
  assert library.stat().st_size <= os.path.getsize(
      str(tmp_path / 'elf')) - DEBUG_BYTES
  assert not (site / 'tensorflow' / 'include').exists()
  assert (site / 'wheels_left').read_text().split() == [
      'six-1.0-py3-none-any.whl']
  for name in ('libcufft.so.11', 'x/cifar-10-binary.tar.gz'):
    assert name in (site / 'the_rest').read_text()

  with open(str(out / parts[1]), 'r+b') as f:
    f.write(b'changed in transit')
  refused = subprocess.run(
      ['bash', str(out / 'install_slim.sh'), str(out), str(tmp_path / 's2')],
      capture_output=True, text=True, timeout=300)
  assert refused.returncode != 0
  assert parts[1] in refused.stdout + refused.stderr
