"""notebooks/towers.ipynb, run top to bottom by a real Jupyter kernel on the
real CIFAR-10 (downloaded through the project's own code from a server on
127.0.0.1); its committed outputs made by its committed code, with no path
of the machine that made them; its first cell fetching the repository
where there is none around it."""

import functools
import http.server
import os
import re
import subprocess
import sys
import threading

import nbformat
import pytest

from conftest import ARCHIVE, REPO

sys.path.insert(0, os.path.join(REPO, 'notebooks'))
import refresh  # pylint: disable=g-import-not-at-top,wrong-import-position

# What a path of the machine that ran the notebook starts with.
MACHINE_PATHS = re.compile(r'(/tmp/|/root/|/home/|/work/|/content/|%s)'
                           % re.escape(REPO))


class _QuietHandler(http.server.SimpleHTTPRequestHandler):

  def log_message(self, *args):
    pass


@pytest.fixture
def archive_url():
  """The real CIFAR-10 archive, served on 127.0.0.1; its URL."""
  if not os.path.exists(ARCHIVE):
    if os.environ.get('CI') == 'true':
      pytest.fail('real CIFAR-10 archive not found at %s' % ARCHIVE)
    pytest.skip('real CIFAR-10 archive not found at %s' % ARCHIVE)
  httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), functools.partial(
      _QuietHandler, directory=os.path.dirname(os.path.abspath(ARCHIVE))))
  thread = threading.Thread(target=httpd.serve_forever, daemon=True)
  thread.start()
  yield 'http://127.0.0.1:%d/%s' % (httpd.server_address[1],
                                    os.path.basename(ARCHIVE))
  httpd.shutdown()
  httpd.server_close()


def _texts(notebook):
  """Everything the notebook's code cells printed or showed as text."""
  texts = []
  for cell in notebook.cells:
    for output in cell.get('outputs', []):
      texts.append(output.get('text', ''))
      texts.append(output.get('data', {}).get('text/plain', ''))
      texts.extend(output.get('traceback', []))
  return '\n'.join(texts)


def _precision(text):
  return float(re.search(r'precision @ 1 = (\d\.\d+) after', text).group(1))


def test_the_notebook_runs_top_to_bottom_in_a_kernel(archive_url, tmp_path):
  env = dict(os.environ, CIFAR10_URL=archive_url,
             CIFAR10_DATA_DIR=str(tmp_path / 'data'), CIFAR10_TENSORBOARD='0')
  # A cell that raises (its own checks of the gradients and the precision
  # among them) fails here, with its traceback.
  notebook = refresh.execute(refresh.NOTEBOOK, env)
  text = _texts(notebook)
  # Downloaded by the notebook into its empty data directory, whole. Checked
  # on disk, not by the 'Successfully downloaded' line (test_download.py
  # checks that): once, in a loaded CI run, the kernel's captured output
  # lacked that line though the download had happened and the cells after
  # it ran.
  archive = tmp_path / 'data' / os.path.basename(ARCHIVE)
  assert archive.stat().st_size == os.path.getsize(ARCHIVE)
  assert (tmp_path / 'data' / 'cifar-10-batches-bin' / 'test_batch.bin').exists()
  assert re.search(r'Running on \d+ CPU cores, .+ \((AVX|AMX)', text) or (
      'Running on GPU:0' in text)
  assert _precision(text) > 0.35
  assert re.search(r'^in all +1,068,298$', text, re.M)
  assert not MACHINE_PATHS.search(text), MACHINE_PATHS.search(text).group(0)


def test_committed_outputs_are_the_committed_codes():
  notebook = nbformat.read(refresh.NOTEBOOK, as_version=4)
  # Refreshed since its code cells last changed (notebooks/refresh.py).
  assert notebook.metadata[refresh.STAMP]['code_sha256'] == (
      refresh.code_digest(notebook))
  code = [cell for cell in notebook.cells if cell.cell_type == 'code']
  assert all(cell.execution_count for cell in code)
  assert not [o for cell in code for o in cell.outputs
              if o.output_type == 'error']
  pictures = [o for cell in code for o in cell.outputs
              if 'image/png' in o.get('data', {})]
  assert len(pictures) == 4  # The data twice, the loss, the noise scale.
  text = _texts(notebook)
  assert _precision(text) > 0.35
  assert not MACHINE_PATHS.search(text), MACHINE_PATHS.search(text).group(0)


def test_a_code_cell_changed_after_the_outputs_is_caught():
  notebook = nbformat.read(refresh.NOTEBOOK, as_version=4)
  before = refresh.code_digest(notebook)
  code = [cell for cell in notebook.cells if cell.cell_type == 'code']
  code[-1].source += '\n'
  assert refresh.code_digest(notebook) != before


def test_outside_the_repository_the_first_cell_fetches_it(tmp_path):
  """As in Colab: no repository around the notebook. The first cell clones
  it (here from this checkout) and installs its requirements."""
  notebook = nbformat.read(refresh.NOTEBOOK, as_version=4)
  first = next(c for c in notebook.cells if c.cell_type == 'code').source
  result = subprocess.run(
      [sys.executable, '-c', first + '\nprint("ROOT", ROOT)'],
      cwd=str(tmp_path), capture_output=True, text=True, timeout=600,
      env=dict(os.environ, CIFAR10_REPOSITORY=REPO))
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'ROOT %s' % (tmp_path / 'cifar10') in result.stdout
  assert (tmp_path / 'cifar10' / 'cifar10_multi_gpu_train.py').exists()


def test_the_docs_open_the_notebook_in_colab():
  link = ('https://colab.research.google.com/github/OWNER/REPO/blob/main/'
          'notebooks/towers.ipynb')
  for page in ('README.md', 'docs/colab.md'):
    with open(os.path.join(REPO, page)) as f:
      assert link in f.read(), page


def test_refresh_joins_a_cells_streams_as_a_terminal_shows_them():
  cell = nbformat.v4.new_code_cell('x')
  stream = nbformat.v4.new_output
  cell.outputs = [stream('stream', name='stdout', text='a\n>> 1%'),
                  stream('stream', name='stderr', text='E\n'),
                  stream('stream', name='stdout', text='\r>> 100%\nok\n'),
                  stream('display_data', data={'text/plain': 'picture'}),
                  stream('stream', name='stdout', text='after\n')]
  notebook = nbformat.v4.new_notebook(cells=[cell])
  refresh.coalesce_streams(notebook)
  assert [(o.output_type, o.get('name'), o.get('text')) for o in
          cell.outputs] == [('stream', 'stdout', 'a\n>> 100%\nok\n'),
                            ('stream', 'stderr', 'E\n'),
                            ('display_data', None, None),
                            ('stream', 'stdout', 'after\n')]
