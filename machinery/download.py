"""Gets the CIFAR-10 binary archive into --data_dir, checked and extracted.

maybe_download_and_extract(data_dir, data_url, data_md5) does nothing when
<data_dir>/cifar-10-batches-bin exists. Otherwise it downloads the archive
from a URL (http(s):// or file://) with a progress line, checks its md5,
and extracts it into a temporary directory that it renames into place, so
that no reader (the evaluator beside the trainer) ever sees a
half-extracted directory. Whatever fails is one errors.DataError line that
says what to do: a URL that cannot be reached, a damaged or foreign
archive, a disk too full for the data. Nothing larger than CIFAR-10 is
downloaded or extracted (an archive bomb given as --data_url): each
member's size is checked before it is written.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import errno
import gzip
import hashlib
import http.client
import os
import shutil
import sys
import tarfile
import tempfile
import zlib

from machinery import errors
from six.moves import urllib

# Where the data comes from: the official archive and its md5.
DATA_URL = 'https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz'
DATA_MD5 = 'c32a1d4ab5d03f1284b67883e8d87530'
# The directory the archive holds, with the binary files.
BATCHES_DIR = 'cifar-10-batches-bin'
# The archive (170 MB) and its extracted files (184 MB) together.
DATA_MEGABYTES = 360
# What an archive may hold, so that a foreign one (an archive bomb) cannot
# fill the disk: CIFAR-10's largest file is 10,000 records of 3,073 bytes;
# its 8 members hold 184,380,061 bytes; its archive is 170,052,171 bytes.
MAX_MEMBER_BYTES = 10000 * 3073
MAX_CONTENT_BYTES = 185 * 10**6
MAX_MEMBERS = 100
MAX_DOWNLOAD_BYTES = 200 * 10**6
# A write that failed for want of space: a full disk, a quota, a file
# size limit (ulimit -f).
FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class _ProgressLine(object):
  """Shows a line rewritten in place ('\\r'), ended before anything else
  prints.

  Use as a context manager: leaving it ends the line, also on an error, so
  an `Error:` line after it starts a line of its own.
  """

  def __init__(self):
    self._shown = False

  def show(self, text):
    sys.stdout.write('\r' + text)
    sys.stdout.flush()
    self._shown = True

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    if self._shown:
      sys.stdout.write('\n')
      sys.stdout.flush()


# What to do when the download itself fails.
_CHECK_URL = ('Check --data_url (a file:// URL works for a local copy of '
              'cifar-10-binary.tar.gz) or extract the archive into --data_dir.')


def _download(url, filepath):
  """Downloads url to filepath, via a temporary file, with a progress line.

  Args:
    url: http(s):// or file:// URL.
    filepath: where the file ends up.

  Raises:
    errors.DataError: the download failed or was cut short, or the file
      could not be written; nothing is left behind.
  """
  filename = os.path.basename(filepath)
  # A file of its own, so that tasks downloading at once do not mix.
  fd, partial = tempfile.mkstemp(prefix=filename + '.', suffix='.part',
                                 dir=os.path.dirname(filepath))
  try:
    with os.fdopen(fd, 'wb') as out, _ProgressLine() as progress:
      _copy_download(url, out, progress, filepath)
  except BaseException:
    os.remove(partial)
    raise
  os.chmod(partial, 0o644)
  # Over a copy another task may have finished meanwhile (os.rename would
  # refuse that on Windows).
  os.replace(partial, filepath)
  print('Successfully downloaded', filename, os.path.getsize(filepath),
        'bytes.')


def _copy_download(url, out, progress, filepath):
  """Copies what url holds to the open file out, showing progress.

  Raises:
    errors.DataError: the download failed (the URL, the network:
      _CHECK_URL) or a write to out failed (a full disk: _full_disk_advice).
  """
  filename = os.path.basename(filepath)
  try:
    response = urllib.request.urlopen(url, timeout=60)
  except (OSError, ValueError, http.client.HTTPException) as e:
    # URLError (an OSError), an unknown URL type (ValueError), ...
    raise errors.DataError('Failed to download %s: %s. %s'
                           % (url, getattr(e, 'reason', e), _CHECK_URL))
  with response:
    total = int(response.headers.get('Content-Length') or 0)
    received = 0
    _check_download_size(url, total)
    while True:
      try:
        chunk = response.read(1 << 20)
      except (OSError, http.client.HTTPException) as e:  # The connection.
        raise errors.DataError('Failed to download %s: %s. %s'
                               % (url, e, _CHECK_URL))
      if not chunk:
        break
      try:
        out.write(chunk)
      except OSError as e:  # The disk.
        raise errors.DataError('Failed to download %s: %s. %s' % (
            url, e, _full_disk_advice(e, filepath) or (
                'Check that --data_dir=%s can be written to.'
                % os.path.dirname(filepath))))
      received += len(chunk)
      _check_download_size(url, received)
      if total:
        progress.show('>> Downloading %s %.1f%%' %
                      (filename, 100.0 * received / total))
      else:
        progress.show('>> Downloading %s %.1f MB' %
                      (filename, received / 1e6))
  if total and received != total:
    raise errors.DataError('Failed to download %s: got %d of %d bytes. %s'
                           % (url, received, total, _CHECK_URL))


def _check_download_size(url, size):
  """Refuses a download larger than CIFAR-10's archive could be.

  Raises:
    errors.DataError: size is over MAX_DOWNLOAD_BYTES.
  """
  if size > MAX_DOWNLOAD_BYTES:
    raise errors.DataError(
        'Failed to download %s: it is more than %s bytes, and CIFAR-10\'s '
        'archive is 170,052,171: it is not the CIFAR-10 binary archive. %s'
        % (url, format(MAX_DOWNLOAD_BYTES, ','), _CHECK_URL))


def _full_disk_advice(error, filepath):
  """Says what to do when a write failed for want of space, or None.

  Args:
    error: the exception a download or an extraction raised.
    filepath: the archive's path in --data_dir.

  Returns:
    A sentence for the error line, or None for other errors.
  """
  if getattr(error, 'errno', None) not in FULL_DISK_ERRNOS:
    return None
  return ('There is no room for the data in %s (it takes about %d MB): free '
          'space there, or choose another --data_dir.'
          % (os.path.dirname(filepath) or '.', DATA_MEGABYTES))


def _extract(filepath, directory):
  """Extracts a .tar.gz archive into directory, with a progress line.

  Each member's size is checked against CIFAR-10's before it is written.

  Raises:
    errors.DataError: the archive holds more than CIFAR-10 does.
    tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile: the archive
      is damaged.
    OSError: a write failed.
  """
  size = os.path.getsize(filepath) or 1
  content = 0
  with open(filepath, 'rb') as raw, _ProgressLine() as progress, \
      tarfile.open(fileobj=raw, mode='r:gz') as tar:
    for count, member in enumerate(tar, 1):
      content += member.size
      _check_member(filepath, member, count, content)
      tar.extract(member, directory, filter='data')
      progress.show('>> Extracting %s %.1f%%' % (
          os.path.basename(filepath), 100.0 * raw.tell() / size))


def _check_member(filepath, member, count, content):
  """Refuses an archive member beyond what CIFAR-10's archive holds.

  Args:
    filepath: the archive.
    member: the tarfile.TarInfo about to be extracted.
    count: how many members so far, this one included.
    content: the bytes of the members so far, this one included.

  Raises:
    errors.DataError: the member is larger than any CIFAR-10 file, or the
      members so far more, or larger together, than CIFAR-10's.
  """
  if member.size > MAX_MEMBER_BYTES:
    what = '%s is %s bytes, more than any CIFAR-10 file (%s)' % (
        member.name, format(member.size, ','), format(MAX_MEMBER_BYTES, ','))
  elif content > MAX_CONTENT_BYTES:
    what = 'its files come to more than CIFAR-10\'s %s bytes by %s' % (
        format(MAX_CONTENT_BYTES, ','), member.name)
  elif count > MAX_MEMBERS:
    what = 'it holds more than %d files' % MAX_MEMBERS
  else:
    return
  raise errors.DataError(
      'Archive %s: %s: it is not the CIFAR-10 binary archive, and nothing of '
      'it is kept. Delete it and check --data_url.' % (filepath, what))


def _md5(filepath):
  """Returns the hex md5 of a file."""
  digest = hashlib.md5()
  with open(filepath, 'rb') as f:
    for chunk in iter(lambda: f.read(1 << 20), b''):
      digest.update(chunk)
  return digest.hexdigest()


def maybe_download_and_extract(data_dir, data_url=DATA_URL, data_md5=''):
  """Downloads and extracts the tarball from Alex's website.

  Does nothing when <data_dir>/cifar-10-batches-bin exists. Otherwise gets
  the archive from data_url (unless it already lies in data_dir),
  checks its md5, extracts it into a temporary directory and renames that
  into place, so that no reader ever sees a half-extracted directory.

  Args:
    data_dir: the data directory.
    data_url: an http(s):// or file:// URL of the archive.
    data_md5: the md5 the archive must have; empty: DATA_MD5 for DATA_URL,
      no check for other URLs.

  Raises:
    errors.DataError: the download failed, or the archive is corrupt or not
      CIFAR-10.
  """
  dest_directory = data_dir
  extracted_dir_path = os.path.join(dest_directory, BATCHES_DIR)
  if os.path.isdir(extracted_dir_path):
    return
  os.makedirs(dest_directory, exist_ok=True)
  url = data_url
  filename = url.split('/')[-1] or 'cifar-10-binary.tar.gz'
  filepath = os.path.join(dest_directory, filename)
  if not os.path.exists(filepath):
    _download(url, filepath)
  expected_md5 = data_md5 or (DATA_MD5 if url == DATA_URL else None)
  actual_md5 = _md5(filepath) if expected_md5 else None
  if actual_md5 != expected_md5:
    raise errors.DataError(
        'Archive %s has md5 %s, not %s: it is corrupt or not the CIFAR-10 '
        'binary archive. Delete it and run again, or pass the right '
        '--data_md5.' % (filepath, actual_md5, expected_md5))
  staging = tempfile.mkdtemp(prefix='.extracting-', dir=dest_directory)
  try:
    _extract(filepath, staging)
    extracted = os.path.join(staging, BATCHES_DIR)
    if not os.path.isdir(extracted):
      raise errors.DataError('Archive %s holds no %s directory: it is not the '
                             'CIFAR-10 binary archive.'
                             % (filepath, BATCHES_DIR))
    try:
      os.rename(extracted, extracted_dir_path)
    except OSError:
      if not os.path.isdir(extracted_dir_path):  # Not a concurrent extractor.
        raise
  except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as e:
    # The archive is damaged (BadGzipFile before the OSError it is).
    raise errors.DataError('Failed to extract %s: %s. Delete it and run again.'
                           % (filepath, e))
  except OSError as e:  # Writing the files, or moving them into place.
    raise errors.DataError('Failed to extract %s: %s. %s' % (
        filepath, e, _full_disk_advice(e, filepath) or (
            'Check that --data_dir=%s can be written to.' % dest_directory)))
  finally:
    shutil.rmtree(staging, ignore_errors=True)
