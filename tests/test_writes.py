"""A failed write read out of TensorFlow's error (machinery/writes.py):
the file and the reason, whatever the directory's name."""

import pytest

from machinery import writes


@pytest.mark.parametrize('directory,path', [
    ('/tmp/run', '/tmp/run/model.ckpt-5_temp/part-00000.data-00000-of-00001'),
    ('/tmp/my run', '/tmp/my run/events.out.tfevents.1795.host'),
    ('C:\\Users\\A B\\run', 'C:\\Users\\A B\\run\\model.ckpt-5.index'),
])
def test_failed_write_reads_the_file_and_the_reason(directory, path):
  error = RuntimeError('%s; No space left on device [Op:SaveV2]' % path)
  assert writes.failed_write(error, directory) == (
      path, 'No space left on device')
  assert writes.failed_write(error, directory + '/') == (
      path, 'No space left on device')


def test_a_write_elsewhere_is_not_the_scripts():
  error = RuntimeError('/tmp/my runner/x.index; No space left on device')
  assert writes.failed_write(error, '/tmp/my run') is None
  assert writes.failed_write(RuntimeError('cancelled'), '/tmp/run') is None
