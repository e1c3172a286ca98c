"""Makes a script a test runs see the packages a user's install has.

The tests' machine has more than requirements.txt installs:
requirements-dev.txt adds the notebook's Jupyter (IPython) and the docs'
plots (matplotlib), and the machine itself may carry others (scipy).
TensorFlow imports Keras and its own legacy Keras as it starts, and they
import IPython, matplotlib's pyplot and scipy.sparse wherever they are
installed: about a fifth of what starting TensorFlow costs a script (about
2 of 9 core-seconds on two AVX2 cores, docs/testing.md). A user who
installed requirements.txt has none of them, and neither has a script that
the tests start with this directory first on PYTHONPATH
(conftest.script_env): here each import of them fails as it would there,
which the importers expect, so a script that came to need one fails its
tests too. Any other sitecustomize on the path still runs after this one.
"""

import importlib.machinery
import importlib.util
import os
import sys

# The packages starting TensorFlow imports where they are installed that
# requirements.txt does not install (tests/test_env.py checks that a
# script's start imports nothing else from outside requirements.txt).
NOT_REQUIRED = ('IPython', 'matplotlib', 'scipy')

for _name in NOT_REQUIRED:
  sys.modules.setdefault(_name, None)  # `import _name` fails: not installed.

# The sitecustomize this one stands in front of, if there is one.
_HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.machinery.PathFinder.find_spec(
    'sitecustomize',
    [p for p in sys.path if os.path.abspath(p or '.') != _HERE])
if _spec is not None:
  _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
