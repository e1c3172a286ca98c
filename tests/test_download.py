"""machinery/download.py's maybe_download_and_extract against a local HTTP
server
and file:// URLs."""

import hashlib
import http.server
import io
import os
import shutil
import tarfile
import threading

import pytest

import cifar10
import cifar10_input
from conftest import make_fake_data, run_limited
from machinery import download
from machinery import errors


def _archive(tmp_path):
  """A small .tar.gz in the CIFAR-10 layout; returns (bytes, md5)."""
  source = tmp_path / 'source'
  make_fake_data(str(source), records_per_file=3)
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode='w:gz') as tar:
    tar.add(str(source / cifar10_input.BATCHES_DIR),
            arcname=cifar10_input.BATCHES_DIR)
  data = buf.getvalue()
  return data, hashlib.md5(data).hexdigest()


class _Server(object):
  """Serves one archive on 127.0.0.1; `cut` sends only part of the body,
  `length` claims another Content-Length (None: no Content-Length), and
  `repeat` sends the body that many times."""

  def __init__(self, body, cut=None, length=-1, repeat=1):
    server = self

    class Handler(http.server.BaseHTTPRequestHandler):

      def do_GET(self):  # pylint: disable=invalid-name
        server.requests += 1
        self.send_response(200)
        if length is not None:
          self.send_header('Content-Length',
                           str(len(body) if length < 0 else length))
        self.end_headers()
        try:
          for _ in range(repeat):
            self.wfile.write(body[:cut] if cut else body)
          self.wfile.flush()
        except ConnectionError:  # The client stopped reading.
          pass
        self.close_connection = True

      def log_message(self, *args):
        pass

    self.requests = 0
    self.httpd = http.server.HTTPServer(('127.0.0.1', 0), Handler)
    self.url = 'http://127.0.0.1:%d/cifar-10-binary.tar.gz' % (
        self.httpd.server_address[1])
    self.thread = threading.Thread(target=self.httpd.serve_forever)
    self.thread.daemon = True
    self.thread.start()

  def close(self):
    self.httpd.shutdown()
    self.httpd.server_close()


@pytest.fixture
def archive(tmp_path):
  return _archive(tmp_path)


def _get(data_dir, url, md5=''):
  download.maybe_download_and_extract(data_dir, url, md5)


def _leftovers(data_dir):
  return sorted(n for n in os.listdir(data_dir)
                if n.startswith('.extracting') or n.endswith('.part'))


def test_http_download_with_progress_and_md5(tmp_path, archive, capsys):
  body, md5 = archive
  server = _Server(body)
  data_dir = str(tmp_path / 'data')
  try:
    _get(data_dir, server.url, md5)
    assert cifar10_input.data_files(data_dir, eval_data=False)
    # Present data: nothing is fetched again.
    _get(data_dir, server.url, md5)
  finally:
    server.close()
  assert server.requests == 1
  out = capsys.readouterr().out
  assert '>> Downloading cifar-10-binary.tar.gz 100.0%' in out
  assert 'Successfully downloaded' in out
  assert _leftovers(data_dir) == []


def test_wrong_md5_is_an_error_and_extracts_nothing(tmp_path, archive):
  body, _ = archive
  server = _Server(body)
  data_dir = str(tmp_path / 'data')
  try:
    with pytest.raises(errors.DataError, match='has md5 .* not 0000'):
      _get(data_dir, server.url, '0' * 32)
  finally:
    server.close()
  assert not os.path.exists(os.path.join(data_dir, cifar10_input.BATCHES_DIR))
  assert _leftovers(data_dir) == []


def test_official_url_checks_official_md5(tmp_path, archive):
  body, _ = archive
  data_dir = tmp_path / 'data'
  data_dir.mkdir()
  (data_dir / 'cifar-10-binary.tar.gz').write_bytes(body)
  with pytest.raises(errors.DataError, match=download.DATA_MD5):
    download.maybe_download_and_extract(str(data_dir))


@pytest.mark.parametrize('cut', [100, 5000])
def test_truncated_body_leaves_nothing(tmp_path, archive, cut):
  body, md5 = archive
  server = _Server(body, cut=cut)
  data_dir = str(tmp_path / 'data')
  try:
    with pytest.raises(errors.DataError, match='Failed to download'):
      _get(data_dir, server.url, md5)
  finally:
    server.close()
  assert sorted(os.listdir(data_dir)) == []


def test_server_gone_is_an_error(tmp_path, archive):
  body, md5 = archive
  server = _Server(body)
  url = server.url
  server.close()
  data_dir = str(tmp_path / 'data')
  with pytest.raises(errors.DataError, match='Failed to download'):
    _get(data_dir, url, md5)
  assert sorted(os.listdir(data_dir)) == []


def test_file_url_of_the_model(tmp_path, archive):
  body, _ = archive
  path = tmp_path / 'copy.tar.gz'
  path.write_bytes(body)
  data_dir = str(tmp_path / 'data')
  cifar10.maybe_download_and_extract(data_dir, 'file://' + str(path))
  assert len(cifar10_input.data_files(data_dir, eval_data=True)) == 1


def test_data_md5_is_checked(tmp_path, archive):
  body, md5 = archive
  path = tmp_path / 'copy.tar.gz'
  path.write_bytes(body)
  url = 'file://' + str(path)
  wrong = str(tmp_path / 'wrong')
  with pytest.raises(errors.DataError, match='has md5 %s, not f{32}' % md5):
    cifar10.maybe_download_and_extract(wrong, url, 'f' * 32)
  assert not os.path.exists(os.path.join(wrong, cifar10_input.BATCHES_DIR))
  right = str(tmp_path / 'right')
  cifar10.maybe_download_and_extract(right, url, md5)
  assert len(cifar10_input.data_files(right, eval_data=True)) == 1


def test_archive_without_cifar_directory(tmp_path):
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode='w:gz') as tar:
    info = tarfile.TarInfo('something/else.txt')
    info.size = 2
    tar.addfile(info, io.BytesIO(b'hi'))
  path = tmp_path / 'other.tar.gz'
  path.write_bytes(buf.getvalue())
  data_dir = str(tmp_path / 'data')
  with pytest.raises(errors.DataError,
                     match='holds no cifar-10-batches'):
    _get(data_dir, 'file://' + str(path))
  assert sorted(os.listdir(data_dir)) == ['other.tar.gz']


def _big_archive(tmp_path, records_per_file):
  """A .tar.gz in the CIFAR-10 layout, its directory the first member."""
  source = tmp_path / 'big_source'
  make_fake_data(str(source), records_per_file=records_per_file)
  path = tmp_path / 'big.tar.gz'
  with tarfile.open(str(path), 'w:gz') as tar:
    tar.add(str(source / cifar10_input.BATCHES_DIR),
            arcname=cifar10_input.BATCHES_DIR)
  return str(path)


@pytest.mark.parametrize('stage', ['download', 'extraction'])
def test_full_disk_error_starts_its_own_line(tmp_path, stage):
  # Random pixels do not compress: 6 files of 300 records are ~5.5 MB, the
  # archive as much. Each 1 MB chunk of the download, and each member
  # extracted (the directory first), advances a progress line.
  archive = _big_archive(tmp_path, records_per_file=300)
  data_dir = tmp_path / 'data'
  data_dir.mkdir()
  if stage == 'extraction':
    shutil.copy(archive, str(data_dir / 'big.tar.gz'))
  limit = 1500000 if stage == 'download' else 500000
  result = run_limited(limit, 'cifar10_train.py',
                       '--data_dir=' + str(data_dir),
                       '--data_url=file://' + archive,
                       '--train_dir=' + str(tmp_path / 'train'),
                       merge_output=True)
  assert result.returncode == 1, result.stdout[-3000:]
  lines = result.stdout.replace('\r', '\n').splitlines()
  errors = [i for i, l in enumerate(lines) if 'Error:' in l]
  assert len(errors) == 1, result.stdout[-3000:]
  error = lines[errors[0]]
  assert error.startswith('Error: Failed to %s ' % (
      'download' if stage == 'download' else 'extract')), error
  assert 'File too large' in error
  # The advice is about space, not about the archive or the URL.
  assert error.endswith('. There is no room for the data in %s (it takes '
                        'about %d MB): free space there, or choose another '
                        '--data_dir.' % (data_dir, download.DATA_MEGABYTES)
                        ), error
  # A progress line came first, and ended before the error.
  progress = '>> %s big.tar.gz ' % (
      'Downloading' if stage == 'download' else 'Extracting')
  assert lines[errors[0] - 1].startswith(progress), lines[-5:]
  assert not os.path.exists(str(data_dir / cifar10_input.BATCHES_DIR))
  assert _leftovers(str(data_dir)) == []


def _zeros_archive(path, sizes):
  """Writes a .tar.gz whose members in cifar-10-batches-bin hold zeros."""
  with tarfile.open(str(path), 'w:gz', compresslevel=1) as tar:
    for i, size in enumerate(sizes):
      info = tarfile.TarInfo('%s/data_batch_%d.bin' % (
          cifar10_input.BATCHES_DIR, i + 1))
      info.size = size
      tar.addfile(info, io.BytesIO(bytes(size)))


def test_archive_bomb_member_is_refused_before_it_is_written(tmp_path):
  # One byte more than CIFAR-10's largest file: compressed, 30 KB. The
  # trainer may write no file over 1 MB: had it begun writing the member,
  # the line would be about a full disk.
  bomb = tmp_path / 'bomb.tar.gz'
  _zeros_archive(bomb, [download.MAX_MEMBER_BYTES + 1])
  data_dir = tmp_path / 'data'
  result = run_limited(10**6, 'cifar10_train.py',
                       '--data_dir=' + str(data_dir),
                       '--data_url=file://' + str(bomb),
                       '--train_dir=' + str(tmp_path / 'train'))
  assert result.returncode == 1, result.stderr[-3000:]
  assert [l for l in result.stderr.splitlines() if 'Error' in l] == [
      'Error: Archive %s: %s/data_batch_1.bin is 30,730,001 bytes, more than '
      'any CIFAR-10 file (30,730,000): it is not the CIFAR-10 binary archive, '
      'and nothing of it is kept. Delete it and check --data_url.'
      % (data_dir / 'bomb.tar.gz', cifar10_input.BATCHES_DIR)]
  assert sorted(os.listdir(str(data_dir))) == ['bomb.tar.gz']
  assert not (tmp_path / 'train').exists()


@pytest.mark.parametrize('sizes,what', [
    # Each member a CIFAR-10 file's size or less, 196 MB together.
    ([28 * 10**6] * 7, "its files come to more than CIFAR-10's 185,000,000 "
                       'bytes by cifar-10-batches-bin/data_batch_7.bin'),
    ([0] * (download.MAX_MEMBERS + 1), 'it holds more than 100 files'),
])
def test_archive_beyond_cifar10s_content_is_refused(tmp_path, sizes, what):
  bomb = tmp_path / 'bomb.tar.gz'
  _zeros_archive(bomb, sizes)
  data_dir = tmp_path / 'data'
  with pytest.raises(errors.DataError) as raised:
    _get(str(data_dir), 'file://' + str(bomb))
  assert str(raised.value) == (
      'Archive %s: %s: it is not the CIFAR-10 binary archive, and nothing of '
      'it is kept. Delete it and check --data_url.'
      % (data_dir / 'bomb.tar.gz', what))
  assert sorted(os.listdir(str(data_dir))) == ['bomb.tar.gz']


@pytest.mark.parametrize('declared', [True, False])
def test_download_larger_than_cifar10_is_refused(tmp_path, declared):
  # Declared: a Content-Length of 1 GB, refused before a byte is read.
  # Streamed: no Content-Length, refused once 200 MB have come.
  chunk = bytes(10**6)
  server = (_Server(b'', length=10**9) if declared else
            _Server(chunk, length=None, repeat=1000))
  data_dir = str(tmp_path / 'data')
  try:
    with pytest.raises(errors.DataError,
                       match=r'it is more than 200,000,000 bytes, and '
                             r"CIFAR-10's archive is 170,052,171"):
      _get(data_dir, server.url)
  finally:
    server.close()
  assert os.listdir(data_dir) == []


@pytest.mark.parametrize('member,refusal', [
    ('../evil.bin', "'../evil.bin' would be extracted to '.*', which is "
                    'outside the destination'),
    ('symlink', "'cifar-10-batches-bin/data_batch_1.bin' is a link to an "
                'absolute path'),
])
def test_archive_reaching_outside_data_dir_writes_nothing_there(
    tmp_path, member, refusal):
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode='w:gz') as tar:
    if member == 'symlink':
      info = tarfile.TarInfo('%s/data_batch_1.bin' % cifar10_input.BATCHES_DIR)
      info.type = tarfile.SYMTYPE
      info.linkname = str(tmp_path / 'target')
      tar.addfile(info)
    else:
      info = tarfile.TarInfo(member)
      info.size = 2
      tar.addfile(info, io.BytesIO(b'hi'))
  (tmp_path / 'bad.tar.gz').write_bytes(buf.getvalue())
  data_dir = tmp_path / 'data'
  with pytest.raises(errors.DataError, match='Failed to extract .*: ' + refusal):
    _get(str(data_dir), 'file://%s' % (tmp_path / 'bad.tar.gz'))
  assert sorted(os.listdir(str(tmp_path))) == ['bad.tar.gz', 'data']
  assert sorted(os.listdir(str(data_dir))) == ['bad.tar.gz']
