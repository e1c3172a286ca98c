"""The house's rules, read off the code: no function that builds a graph
reads a flag (the scripts' main and run_training read them and pass values
down), and machinery/__init__.py names every module of the package."""

import ast
import glob
import os
import re

from conftest import REPO

# The functions that read the flags and build the graph with their values:
# each script's main, and the loop that trains or evaluates.
READERS = {'main', 'run_training', 'evaluate'}

# Where the model's graph starts: the model, the input's datasets, the
# graph's seed. A function that calls one of them, or that such a function
# calls, builds the graph.
MODEL = {('cifar10', 'inference'), ('cifar10_input', '_dataset'),
         ('machinery.session', 'seed_graph')}


def _modules():
  """{module name: its parsed source} of every file of the house (the
  scripts at the top, docs' scripts, machinery), tests aside."""
  paths = (glob.glob(os.path.join(REPO, '*.py')) +
           glob.glob(os.path.join(REPO, 'machinery', '*.py')))
  modules = {}
  for path in paths:
    name = os.path.relpath(path, REPO)[:-3].replace(os.sep, '.')
    with open(path) as f:
      modules[name] = ast.parse(f.read(), path)
  return modules


def _imports(tree):
  """{local name: module name} of a module's imports of the house."""
  names = {}
  for node in tree.body:
    if isinstance(node, ast.Import):
      for alias in node.names:
        names[alias.asname or alias.name] = alias.name
    elif isinstance(node, ast.ImportFrom) and node.module == 'machinery':
      for alias in node.names:
        names[alias.asname or alias.name] = 'machinery.' + alias.name
  return names


def _functions(tree):
  """{name: node} of a module's functions and its classes' methods (as
  Class.method)."""
  found = {}
  for node in tree.body:
    if isinstance(node, ast.FunctionDef):
      found[node.name] = node
    elif isinstance(node, ast.ClassDef):
      for item in node.body:
        if isinstance(item, ast.FunctionDef):
          found['%s.%s' % (node.name, item.name)] = item
  return found


def _dotted(node):
  """'a.b.c' of a Name or an Attribute chain, or None."""
  if isinstance(node, ast.Name):
    return node.id
  if isinstance(node, ast.Attribute):
    inner = _dotted(node.value)
    return inner and inner + '.' + node.attr
  return None


def _reads_flags(function):
  """Whether function reads a flag's value: FLAGS.x, FLAGS['x'], 'x' in
  FLAGS."""
  for node in ast.walk(function):
    if isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(
        node.value, ast.Name) and node.value.id == 'FLAGS':
      return True
    if isinstance(node, ast.Compare) and any(
        isinstance(c, ast.Name) and c.id == 'FLAGS' for c in node.comparators):
      return True
  return False


def _calls(modules):
  """{(module, function): the (module, function) pairs of the house it
  calls or hands on (a function passed as a value) by name}."""
  calls = {}
  for module, tree in modules.items():
    imports = _imports(tree)
    functions = _functions(tree)
    for name, function in functions.items():
      called = set()
      for node in ast.walk(function):
        dotted = _dotted(node) or ''
        head, _, rest = dotted.partition('.')
        if head in imports and rest:
          called.add((imports[head], rest))
        elif dotted in functions:
          called.add((module, dotted))
      calls[(module, name)] = called
  return calls


def _graph_builders(modules):
  """{(module, function)} of the functions that build the model's graph
  other than READERS: those that call MODEL's, to a fixed point, and all
  that they call."""
  calls = _calls(modules)
  builders = set(MODEL)
  grown = True
  while grown:
    grown = False
    for function, called in calls.items():
      if function not in builders and called & builders:
        builders.add(function)
        grown = True
  builders = {f for f in builders if f[1] not in READERS}
  todo = list(builders)
  while todo:
    for callee in calls.get(todo.pop(), ()):
      if callee in calls and callee not in builders:
        builders.add(callee)
        todo.append(callee)
  return builders


def test_no_function_that_builds_a_graph_reads_a_flag():
  modules = _modules()
  builders = _graph_builders(modules)
  assert ('cifar10', 'inference') in builders  # The rule sees the model.
  assert ('cifar10_multi_gpu_train', 'build_graph') in builders
  readers = sorted(
      '%s.%s' % function for function in builders
      if _reads_flags(_functions(modules[function[0]])[function[1]]))
  assert not readers, readers


def test_the_package_names_every_module():
  with open(os.path.join(REPO, 'machinery', '__init__.py')) as f:
    named = set(re.findall(r'^  (\w+) {2,}\S', ast.get_docstring(
        ast.parse(f.read())), re.M))
  modules = {os.path.basename(p)[:-3] for p in glob.glob(
      os.path.join(REPO, 'machinery', '*.py'))} - {'__init__'}
  assert named == modules
