"""Runs notebooks/towers.ipynb top to bottom in a Jupyter kernel and writes
its outputs into it, so that GitHub shows them.

    python notebooks/refresh.py

CIFAR-10 comes from ../shared/data's copy beside the repository (a
file:// URL), or from --data_url. The notebook's metadata then holds the
digest of its code cells: tests/test_notebook.py fails when a code cell
changes after its outputs were made.
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import argparse
import hashlib
import os
import tempfile

import nbclient
import nbformat

HERE = os.path.dirname(os.path.abspath(__file__))
NOTEBOOK = os.path.join(HERE, 'towers.ipynb')
SHARED_ARCHIVE = os.path.join(HERE, '..', '..', 'shared', 'data',
                              'cifar-10-binary.tar.gz')
# The notebook's metadata key for what refresh() wrote.
STAMP = 'cifar10_refresh'
CELL_TIMEOUT_SECS = 600


def code_digest(notebook):
  """Returns the sha256 of the notebook's code cells, in order."""
  sources = [cell.source for cell in notebook.cells
             if cell.cell_type == 'code']
  return hashlib.sha256('\0'.join(sources).encode('utf-8')).hexdigest()


def coalesce_streams(notebook):
  """Joins each code cell's outputs to one stream (stdout, stderr) into
  one, up to the next picture, each line as a terminal leaves it (a
  progress line rewritten with '\\r' keeps its last text)."""
  for cell in notebook.cells:
    if cell.cell_type != 'code':
      continue
    outputs, streams = [], {}
    for output in cell.outputs:
      if output.output_type != 'stream':
        streams = {}  # A picture or a value: later text comes after it.
        outputs.append(output)
      elif output.name in streams:
        streams[output.name].text += output.text
      else:
        streams[output.name] = output
        outputs.append(output)
    for output in outputs:
      if output.output_type == 'stream':
        output.text = '\n'.join(line.split('\r')[-1]
                                for line in output.text.split('\n'))
    cell.outputs = outputs


def execute(path, env, timeout=CELL_TIMEOUT_SECS):
  """Runs the notebook at path in a new python3 kernel, in its own
  directory, with the environment env; returns the notebook with its
  outputs. A cell that raises raises nbclient's CellExecutionError."""
  notebook = nbformat.read(path, as_version=4)
  client = nbclient.NotebookClient(
      notebook, timeout=timeout, kernel_name='python3', record_timing=False,
      resources={'metadata': {'path': os.path.dirname(os.path.abspath(path))}})
  client.execute(env=env)
  return notebook


def refresh(data_url):
  """Runs the notebook with CIFAR-10 from data_url into a new directory,
  and writes its outputs and code digest into it."""
  with tempfile.TemporaryDirectory() as data_dir:
    env = dict(os.environ, CIFAR10_URL=data_url, CIFAR10_DATA_DIR=data_dir,
               CIFAR10_TENSORBOARD='0')
    notebook = execute(NOTEBOOK, env)
  coalesce_streams(notebook)
  notebook.metadata[STAMP] = {'code_sha256': code_digest(notebook)}
  nbformat.write(notebook, NOTEBOOK)


def main():
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--data_url', default='file://' + os.path.abspath(
      SHARED_ARCHIVE))
  refresh(p.parse_args().data_url)
  print('Wrote %s' % NOTEBOOK)


if __name__ == '__main__':
  main()
