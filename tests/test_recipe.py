"""The training recipes: optimizers, schedules, the budget, resuming them."""

import glob
import math
import os

from absl.testing import flagsaver
import numpy as np
import pytest
import tensorflow as tf

import cifar10
import cifar10_distributed_train as dist
import cifar10_multi_gpu_train as multi
import cifar10_train  # pylint: disable=unused-import  (--train_dir)
from conftest import error_lines, evaluate, train
from machinery import cluster
from machinery import errors
from machinery import lars
from machinery import recipe as recipes
from machinery import session

tf1 = tf.compat.v1

# Some tests here run the scripts' own code, which reads the flags.
pytestmark = pytest.mark.usefixtures('parsed_flags')

# Steps of the tests' in-process runs, and where the split runs stop first.
STEPS, SPLIT = 6, 3
BATCH = 8


def _recipe(**changes):
  return recipes.TUTORIAL._replace(**changes)


# --- LARS against numpy -----------------------------------------------------


def _numpy_lars(w, b, grads_of, rate, momentum, eta, nesterov, steps):
  """LARS by hand: the weights' gradient times eta |w| / |g|, the biases'
  as it is, then TensorFlow's momentum (accum = m accum + g; var -= lr *
  accum, or with Nesterov var -= lr * (g + m accum))."""
  acc_w, acc_b = np.zeros_like(w), np.zeros_like(b)
  for _ in range(steps):
    g_w, g_b = grads_of(w, b)
    g_w = g_w * eta * np.linalg.norm(w) / np.linalg.norm(g_w)
    acc_w = momentum * acc_w + g_w
    acc_b = momentum * acc_b + g_b
    if nesterov:
      w = w - rate * (g_w + momentum * acc_w)
      b = b - rate * (g_b + momentum * acc_b)
    else:
      w, b = w - rate * acc_w, b - rate * acc_b
  return w, b


@pytest.mark.parametrize('nesterov', [False, True])
def test_lars_matches_steps_computed_by_hand(nesterov):
  rng = np.random.RandomState(0)
  w0 = rng.normal(size=(4, 3)).astype(np.float64)
  b0 = rng.normal(size=(3,)).astype(np.float64)
  x = rng.normal(size=(5, 4))
  target = rng.normal(size=(5, 3))

  def grads_of(w, b):  # Of 0.5 * |x w + b - target|^2.
    residual = x @ w + b - target
    return x.T @ residual, residual.sum(axis=0)

  rate, momentum, eta, steps = 0.5, 0.9, 0.01, 4
  with tf.Graph().as_default():
    with tf1.variable_scope('layer'):
      w = tf1.get_variable('weights', initializer=w0)
      b = tf1.get_variable('biases', initializer=b0)
    loss = 0.5 * tf.reduce_sum(tf.square(tf.matmul(x, w) + b - target))
    opt = lars.LARSOptimizer(rate, momentum, eta, use_nesterov=nesterov)
    train_op = opt.minimize(loss)
    with tf1.Session() as sess:
      sess.run([tf1.global_variables_initializer(),
                tf1.local_variables_initializer()])
      for _ in range(steps):
        sess.run(train_op)
      got_w, got_b = sess.run([w, b])
  want_w, want_b = _numpy_lars(w0, b0, grads_of, rate, momentum, eta,
                               nesterov, steps)
  # TensorFlow holds the momentum and rate as float32 (0.9 is 0.8999999762),
  # which moves the float64 values by a few parts in 1e9.
  np.testing.assert_allclose(got_w, want_w, rtol=1e-7)
  np.testing.assert_allclose(got_b, want_b, rtol=1e-7)
  # The biases moved as plain momentum would: far more than eta allows.
  assert np.abs(got_b - b0).max() > 10 * eta * np.linalg.norm(b0)


def test_lars_leaves_a_zero_layer_unscaled():
  with tf.Graph().as_default():
    opt = lars.LARSOptimizer(0.1, 0.9, 0.001)
    ratio = opt.trust_ratio(tf.constant([1.0, 2.0]), tf.zeros([2]))
    with tf1.Session() as sess:
      assert sess.run(ratio) == 1.0


# --- The optimizers and schedules the recipe builds ---------------------------


def test_optimizers_are_tensorflows_own():
  with tf.Graph().as_default():
    sgd = cifar10.optimizer(0.1)
    momentum = cifar10.optimizer(0.1, _recipe(optimizer='momentum',
                                              momentum=0.8, nesterov=True))
    lars_opt = cifar10.optimizer(0.1, _recipe(optimizer='lars',
                                              trust_coefficient=0.02))
  assert type(sgd) is tf1.train.GradientDescentOptimizer  # pylint: disable=unidiomatic-typecheck
  assert type(momentum) is tf1.train.MomentumOptimizer  # pylint: disable=unidiomatic-typecheck
  assert (momentum._momentum, momentum._use_nesterov) == (0.8, True)  # pylint: disable=protected-access
  assert isinstance(lars_opt, lars.LARSOptimizer)
  assert lars_opt._trust_coefficient == 0.02  # pylint: disable=protected-access


def _rates(recipe, examples_per_step, steps):
  """The learning rate the graph gives at each of steps."""
  with tf.Graph().as_default():
    global_step = tf1.train.get_or_create_global_step()
    lr = cifar10.learning_rate(global_step, examples_per_step, recipe)
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      rates = []
      for step in steps:
        sess.run(tf1.assign(global_step, step))
        rates.append(sess.run(lr))
  return rates


@pytest.mark.parametrize('schedule', ['cosine', 'linear'])
def test_decay_to_zero_after_warmup_at_the_budget(schedule):
  # Four towers of 128: 512 examples a step, so 10 epochs are 977 steps
  # (rounded up) and the 2-epoch warm-up 195; the rate 0.05 scaled by 4.
  recipe = _recipe(initial_learning_rate=0.05, learning_rate_scaling='linear',
                   warmup_epochs=2, lr_schedule=schedule, train_epochs=10)
  budget, warmup, peak = math.ceil(10 * 50000 / 512), int(2 * 50000 / 512), 0.2
  assert recipe.budget_steps(512) == budget == 977
  steps = [0, 100, warmup, 400, 700, budget - 1, budget, budget + 50]
  want = []
  for step in steps:
    if step < warmup:
      want.append(0.05 + (peak - 0.05) * step / warmup)
      continue
    done = min(step - warmup, budget - warmup) / (budget - warmup)
    want.append(peak * (0.5 * (1 + math.cos(math.pi * done))
                        if schedule == 'cosine' else 1 - done))
  np.testing.assert_allclose(_rates(recipe, 512, steps), want, rtol=1e-5,
                             atol=1e-7)


def test_tutorial_schedule_with_a_budget_keeps_its_staircase():
  recipe = _recipe(train_epochs=5)
  assert _rates(recipe, 128, [0, 1900]) == pytest.approx([0.1, 0.1])
  assert recipe.last_step(100000, 128) == math.ceil(5 * 50000 / 128)
  assert recipe.last_step(100, 128) == 100


@pytest.mark.parametrize('changes, flag', [
    (dict(train_epochs=-1.0), '--train_epochs=-1: give a number of epochs'),
    (dict(lr_schedule='cosine'), '--lr_schedule=cosine decays the rate to '
     'zero at --train_epochs: give --train_epochs.'),
    (dict(lr_schedule='linear', train_epochs=2, warmup_epochs=3),
     'The schedule would end at --train_epochs=2 before its warm-up does'),
    (dict(momentum=-0.5), '--momentum=-0.5: give a momentum from 0'),
    (dict(momentum=1.0), '--momentum=1: give a momentum from 0'),
    (dict(trust_coefficient=0.0), '--lars_trust_coefficient=0: give'),
    (dict(conv_weight_decay=-0.001), '--conv_weight_decay=-0.001: give a '
     'factor from 0'),
    (dict(fc_weight_decay=-0.004), '--fc_weight_decay=-0.004: give a '
     'factor from 0'),
    (dict(fc_weight_decay=1.0), '--fc_weight_decay=1: give a factor from 0'),
    (dict(label_smoothing=1.0), '--label_smoothing=1: give a share from 0'),
    (dict(label_smoothing=-0.1), '--label_smoothing=-0.1: give a share'),
    (dict(dropout=1.0), '--dropout=1: give a share from 0'),
    (dict(dropout=-0.2), '--dropout=-0.2: give a share from 0'),
    (dict(cutout=25), '--cutout=25: give a side in pixels from 0 (none) to '
     '24.'),
    (dict(cutout=-1), '--cutout=-1: give a side in pixels from 0'),
    (dict(mixup=-0.2), '--mixup=-0.2: give the alpha of Beta(alpha, alpha) '
     'above 0, or 0 (none).'),
    (dict(mixup=float('inf')), '--mixup=inf: give the alpha'),
    (dict(mixup=float('nan')), '--mixup=nan: give the alpha'),
    (dict(moving_average_decay=1.0), '--moving_average_decay=1: give a decay'),
    (dict(moving_average_decay=0.0), '--moving_average_decay=0: give a decay'),
])
def test_recipes_that_cannot_train_are_refused(changes, flag):
  with pytest.raises(errors.UsageError) as raised:
    recipes.check(_recipe(**changes))
  assert str(raised.value).startswith(flag)


def test_refused_recipe_is_one_error_line_and_writes_nothing(fake_data_dir,
                                                             tmp_path):
  train_dir = str(tmp_path / 'train')
  result = train(fake_data_dir, train_dir, '--lr_schedule=cosine',
                 '--train_epochs=1', '--warmup_epochs=2')
  assert result.returncode == 1
  assert error_lines(result.stderr) == [
      'Error: The schedule would end at --train_epochs=1 before its warm-up '
      'does (--warmup_epochs=2): give more --train_epochs or a shorter '
      'warm-up.']
  assert not os.path.exists(train_dir)


# --- Every trainer's graph: the rate it schedules, the optimizer it makes ----


def _learning_rate_at(graph, steps):
  """The learning rate a built trainer graph gives at each global step.

  The graph's 'learning_rate' summary, evaluated alone, on this machine,
  with the global step it reads fed in.
  """
  lr, = [s.op.inputs[1] for s in graph.get_collection(
      tf1.GraphKeys.SUMMARIES) if s.op.type == 'ScalarSummary' and
         s.op.inputs[0].op.get_attr('value').string_val == [b'learning_rate']]
  graph_def = tf1.graph_util.extract_sub_graph(graph.as_graph_def(),
                                               [lr.op.name])
  for node in graph_def.node:
    node.device = ''
  with tf.Graph().as_default() as alone:
    tf1.import_graph_def(graph_def, name='')
    read, = [op.outputs[0] for op in alone.get_operations()
             if op.type == 'ReadVariableOp']
    with tf1.Session() as sess:
      return [sess.run(lr.name, {read: step}) for step in steps]


TRAINERS = [
    ('single tower', 8), ('multi-GPU, 2 towers', 16),
    ('ps sync, 2 workers x 2 towers', 32), ('ps async, 2 x 2', 16),
    ('all-reduce, 2 workers x 2 towers', 32)]


def _trainer_graph(trainer, data_dir, **changes):
  """Builds a trainer's graph (TRAINERS) with batches of 8 per tower, on the
  tutorial's recipe with changes."""
  ps_task = cluster.Task(['127.0.0.1:1'], ['127.0.0.1:2', '127.0.0.1:3'],
                         'worker', 1, 'a test')
  all_reduce_task = cluster.Task([], ['127.0.0.1:2', '127.0.0.1:3'],
                                 'worker', 1, 'a test')
  recipe = recipes.TUTORIAL._replace(**changes)
  batches = lambda n: cifar10.distorted_batches(data_dir, 8, n)
  build = {
      'single tower': lambda: cifar10_train.build_train_op(
          batches(1), [''], recipe),
      'multi-GPU, 2 towers': lambda: multi.build_graph(
          data_dir, 8, 2, True, 'parameter_server', recipe),
      'ps sync, 2 workers x 2 towers': lambda: dist.build_worker_graph(
          ps_task, batches(2), ['/cpu:0', '/cpu:1'], True, recipe),
      'ps async, 2 x 2': lambda: dist.build_worker_graph(
          ps_task, batches(2), ['/cpu:0', '/cpu:1'], False, recipe),
      'all-reduce, 2 workers x 2 towers': lambda: dist.build_allreduce_graph(
          all_reduce_task, batches(2), ['/cpu:0', '/cpu:1'], recipe),
  }[trainer]
  with tf.Graph().as_default() as graph:
    build()
  return graph


@pytest.mark.parametrize('trainer,examples_per_step', TRAINERS)
def test_learning_rate_decays_after_350_epochs_of_the_trainers_examples(
    fake_data_dir, trainer, examples_per_step):
  graph = _trainer_graph(trainer, fake_data_dir)
  decay = int(50000 / examples_per_step * 350)
  assert _learning_rate_at(graph, [0, decay - 1, decay]) == pytest.approx(
      [0.1, 0.1, 0.01])


@pytest.mark.parametrize('trainer,examples_per_step', TRAINERS)
def test_linear_scaling_and_warmup_count_every_towers_examples(
    fake_data_dir, trainer, examples_per_step):
  graph = _trainer_graph(trainer, fake_data_dir,
                         learning_rate_scaling='linear', warmup_epochs=2.0)
  # The tutorial's 0.1 for its 128 examples a step, scaled to this step's.
  scaled = 0.1 * examples_per_step / 128
  warmup = int(50000 / examples_per_step * 2)
  decay = int(50000 / examples_per_step * 350)
  assert _learning_rate_at(
      graph, [0, warmup // 2, warmup, decay - 1, decay]) == pytest.approx(
          [0.1, 0.1 + (scaled - 0.1) * (warmup // 2) / warmup, scaled,
           scaled, scaled / 10])


@pytest.mark.parametrize('trainer,examples_per_step', TRAINERS)
@pytest.mark.parametrize('optimizer', ['momentum', 'lars'])
def test_every_trainer_takes_the_optimizer_and_the_budget(
    fake_data_dir, trainer, examples_per_step, optimizer):
  graph = _trainer_graph(trainer, fake_data_dir, optimizer=optimizer,
                         lr_schedule='linear', train_epochs=4.0)
  budget = math.ceil(4 * 50000 / examples_per_step)
  assert _learning_rate_at(graph, [0, budget // 2, budget]) == pytest.approx(
      [0.1, 0.1 * (1 - (budget // 2) / budget), 0.0], abs=1e-7)
  slot = 'Momentum' if optimizer == 'momentum' else 'LARS'
  with graph.as_default():
    slots = {v.op.name for v in tf1.global_variables()
             if v.op.name.endswith('/' + slot)}
  assert 'conv1/weights/' + slot in slots
  assert 'softmax_linear/biases/' + slot in slots


# --- Regularization: the convolutions' weight decay, smoothed labels ----------


def _numpy_loss(logits, labels, smoothing, kernels, conv_wd, dense, dense_wd):
  """The total loss by hand: the cross entropy against labels smoothed by
  smoothing, plus wd times half the squared norm of each weight."""
  shifted = logits - logits.max(axis=1, keepdims=True)
  log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
  targets = np.full(logits.shape, smoothing / 10)
  targets[np.arange(len(labels)), labels] += 1 - smoothing
  cross_entropy = -(targets * log_p).sum(axis=1).mean()
  decay = lambda ws, wd: wd * sum(0.5 * np.sum(w ** 2) for w in ws)
  return cross_entropy + decay(kernels, conv_wd) + decay(dense, dense_wd)


@pytest.mark.parametrize('conv_wd, fc_wd, smoothing', [
    (0.0, None, 0.0), (0.01, None, 0.0), (0.0, None, 0.2), (0.01, None, 0.2),
    (0.0, 0.0, 0.0), (0.01, 0.001, 0.2)])
def test_the_loss_decays_the_layers_and_smooths_the_labels(conv_wd, fc_wd,
                                                           smoothing):
  rng = np.random.RandomState(0)
  images = rng.normal(size=(BATCH, 24, 24, 3)).astype(np.float32)
  labels = rng.randint(0, 10, size=BATCH).astype(np.int32)
  # None: the fully connected layers' decay untold, the tutorial's 0.004.
  fc = {} if fc_wd is None else dict(fc_weight_decay=fc_wd)
  with tf.Graph().as_default():
    logits = cifar10.inference(tf.constant(images), conv_weight_decay=conv_wd,
                               **fc)
    loss = cifar10.loss(logits, tf.constant(labels), smoothing)
    weights = {v.op.name: v for v in tf1.trainable_variables()}
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      got, logits_value, values = sess.run([loss, logits, weights])
  expected = _numpy_loss(
      logits_value, labels, smoothing,
      [values['conv%d/weights' % i] for i in (1, 2)], conv_wd,
      [values['local%d/weights' % i] for i in (3, 4)],
      0.004 if fc_wd is None else fc_wd)
  assert got == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize('smoothing', [0.0, 0.2])
def test_the_loss_takes_labels_as_shares_of_the_classes(smoothing):
  """Mixup's labels, each a blend of two classes: the cross entropy
  against the blend (smoothed as a label is); a label given as its
  one-hot shares: the loss of the label itself."""
  rng = np.random.RandomState(1)
  logits = rng.normal(size=(BATCH, 10)).astype(np.float32)
  labels = rng.randint(0, 10, size=BATCH)
  partners = rng.randint(0, 10, size=BATCH)
  own = rng.uniform(size=BATCH)
  shares = own[:, None] * np.eye(10)[labels] + (
      1 - own[:, None]) * np.eye(10)[partners]
  given = [labels.astype(np.int32), np.eye(10, dtype=np.float32)[labels],
           shares.astype(np.float32)]
  values = []
  for label in given:  # A graph each: the loss adds its graph's 'losses'.
    with tf.Graph().as_default():
      loss = cifar10.loss(tf.constant(logits), tf.constant(label), smoothing)
      with tf1.Session() as sess:
        values.append(sess.run(loss))
  as_label, as_one_hot, as_shares = values
  log_p = np.log(np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True))
  smoothed = shares * (1 - smoothing) + smoothing / 10
  assert as_shares == pytest.approx(-(smoothed * log_p).sum(axis=1).mean(),
                                    rel=1e-5)
  assert as_one_hot == pytest.approx(as_label, rel=1e-6)


@pytest.mark.parametrize('rate', [None, 0.3])
def test_dropout_drops_a_share_of_the_fully_connected_outputs(rate):
  rng = np.random.RandomState(0)
  images = rng.normal(size=(64, 24, 24, 3)).astype(np.float32)
  with tf.Graph().as_default() as graph:
    tf1.set_random_seed(1)
    cifar10.inference(tf.constant(images), dropout=rate)
    # Each fully connected layer's ReLUs, and what the next layer reads.
    layers = [(graph.get_tensor_by_name(made),
               graph.get_operation_by_name(reader).inputs[0])
              for made, reader in (('local3/local3:0', 'local4/MatMul'),
                                   ('local4/local4:0', 'softmax_linear/MatMul'))]
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      values = sess.run(layers)
  for made, fed in values:
    alive = made > 0  # The ReLUs' outputs that dropout can drop.
    if rate is None:
      np.testing.assert_array_equal(fed, made)  # The tutorial's model.
      continue
    dropped = alive & (fed == 0)
    assert dropped.sum() / alive.sum() == pytest.approx(rate, abs=0.03)
    kept = alive & ~dropped
    np.testing.assert_allclose(fed[kept], made[kept] / (1 - rate), rtol=1e-5)


def _ancestors(tensor):
  """The names of the ops tensor is computed from."""
  seen, todo = set(), [tensor.op]
  while todo:
    op = todo.pop()
    if op.name not in seen:
      seen.add(op.name)
      todo.extend(t.op for t in op.inputs)
  return seen


@pytest.mark.parametrize('trainer,examples_per_step', TRAINERS)
def test_every_trainer_takes_the_regularization(fake_data_dir, trainer,
                                                examples_per_step):
  del examples_per_step
  graphs = [_trainer_graph(trainer, fake_data_dir),
            _trainer_graph(trainer, fake_data_dir, conv_weight_decay=0.01,
                           label_smoothing=0.1, dropout=0.3,
                           fc_weight_decay=0.0)]
  found = []
  for graph in graphs:
    totals = [op.outputs[0] for op in graph.get_operations()
              if op.name.endswith('total_loss') and op.type == 'AddN']
    assert totals
    ancestors = [_ancestors(total) for total in totals]
    found.append([(any(n.endswith('conv1/weight_loss') for n in names),
                   any(n.endswith('conv2/weight_loss') for n in names),
                   any('label_smoothing/' in n for n in names),
                   any('local3/dropout/' in n for n in names),
                   any('local4/dropout/' in n for n in names),
                   # The tutorial's decay of local3, gone at 0.
                   not any(n.endswith('local3/weight_loss') for n in names))
                  for names in ancestors])
  tutorial, regularized = found
  assert set(tutorial) == {(False,) * 6}  # Nothing changes.
  assert set(regularized) == {(True,) * 6}  # In every tower.


def _decays(graph):
  """The values of the decay constants of the graph's moving averages."""
  return {round(float(tf.make_ndarray(op.get_attr('value'))), 6)
          for op in graph.get_operations()
          if op.type == 'Const' and op.name.endswith('decay') and
          op.get_attr('value').dtype == tf.float32.as_datatype_enum}


@pytest.mark.parametrize('trainer,examples_per_step', TRAINERS)
def test_every_trainer_takes_the_moving_averages_decay(fake_data_dir, trainer,
                                                      examples_per_step):
  del examples_per_step
  tutorial = _decays(_trainer_graph(trainer, fake_data_dir))
  shorter = _decays(_trainer_graph(trainer, fake_data_dir,
                                   moving_average_decay=0.999))
  assert 0.9999 in tutorial and 0.999 not in tutorial
  assert 0.999 in shorter and 0.9999 not in shorter


# --- Resuming continues the schedule, the slots and the averages -------------


def _train_in_process(train_dir, recipe, last):
  """Trains cifar10.train on one fixed batch in the trainers' session until
  step last, resuming from train_dir's checkpoint; returns the checkpoint's
  values by name."""
  rng = np.random.RandomState(0)
  images = rng.normal(size=(BATCH, 24, 24, 3)).astype(np.float32)
  labels = rng.randint(0, 10, size=BATCH).astype(np.int32)
  with flagsaver.flagsaver(train_dir=train_dir), tf.Graph().as_default():
    tf1.set_random_seed(1)
    global_step = tf1.train.get_or_create_global_step()
    loss = cifar10.loss(cifar10.inference(tf.constant(images)),
                        tf.constant(labels))
    train_op = cifar10.train(loss, global_step, BATCH, recipe)
    with session.training_session(loss, BATCH, recipe,
                                  last=last) as mon_sess:
      while not mon_sess.should_stop():
        mon_sess.run(train_op)
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(train_dir))
  return {name: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map()}


# The budget: STEPS steps of BATCH examples, so the rate reaches 0 there.
BUDGET = STEPS * BATCH / 50000


@pytest.mark.parametrize('changes, slot', [
    (dict(optimizer='momentum'), 'Momentum'),
    (dict(optimizer='momentum', nesterov=True), 'Momentum'),
    (dict(optimizer='lars', initial_learning_rate=1.0), 'LARS'),
    (dict(lr_schedule='cosine', train_epochs=BUDGET), None),
    (dict(optimizer='momentum', lr_schedule='linear', train_epochs=BUDGET,
          warmup_epochs=BUDGET / 3, learning_rate_scaling='linear',
          initial_learning_rate=0.01), 'Momentum'),
])
def test_resumed_run_is_the_run_without_a_stop(tmp_path, changes, slot):
  recipe = _recipe(**changes)
  straight = _train_in_process(str(tmp_path / 'straight'), recipe, STEPS)
  _train_in_process(str(tmp_path / 'split'), recipe, SPLIT)
  split = _train_in_process(str(tmp_path / 'split'), recipe, STEPS)
  assert straight['global_step'] == split['global_step'] == STEPS
  assert sorted(straight) == sorted(split)
  slots = [n for n in straight if slot and n.endswith('/' + slot)]
  assert len(slots) == (10 if slot else 0)
  for name in slots:  # Saved as they were, not as they started.
    assert np.abs(straight[name]).max() > 0, name
  assert len([n for n in straight if n.endswith('ExponentialMovingAverage')
              and 'loss' not in n]) == 10
  for name, value in straight.items():
    np.testing.assert_allclose(split[name], value, rtol=1e-5, atol=1e-7,
                               err_msg=name)


def test_the_tutorials_checkpoint_holds_no_recipe_variables(tmp_path):
  values = _train_in_process(str(tmp_path / 'run'), recipes.TUTORIAL, 2)
  layers = ('conv1', 'conv2', 'local3', 'local4', 'softmax_linear')
  variables = ['%s/%s' % (l, v) for l in layers for v in ('weights', 'biases')]
  # The variables, their moving averages, the step; and the losses' moving
  # averages (the step line's).
  assert {n for n in values if not n.endswith('/avg')} == set(
      variables + [v + '/ExponentialMovingAverage' for v in variables] +
      ['global_step'])


# --- The trainers with a recipe, end to end -------------------------------------


def _event_scalars(directory):
  """{tag: {step: value}} of the scalar summaries in directory's events."""
  scalars = {}
  for path in glob.glob(os.path.join(directory, 'events.out.tfevents.*')):
    for event in tf1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.HasField('simple_value'):
          scalars.setdefault(value.tag, {})[event.step] = value.simple_value
  return scalars


@pytest.mark.parametrize('script, flags', [
    ('cifar10_train.py', ['--optimizer=lars', '--initial_learning_rate=2']),
    ('cifar10_multi_gpu_train.py', ['--optimizer=momentum', '--nesterov',
                                    '--num_gpus=2', '--virtual_gpus',
                                    '--variable_update=replicated']),
])
def test_trainer_stops_at_the_budget_and_evaluates(fake_data_dir, tmp_path,
                                                   script, flags):
  towers = 2 if '--num_gpus=2' in flags else 1
  budget = math.ceil(0.004 * 50000 / (16 * towers))  # 13 or 7 steps.
  train_dir = str(tmp_path / 'train')
  common = ['--batch_size=16', '--lr_schedule=cosine', '--train_epochs=0.004',
            '--save_summaries_steps=1', '--seed=1'] + flags
  result = train(fake_data_dir, train_dir, *common, script=script)
  assert result.returncode == 0, result.stderr[-3000:]
  assert tf.train.latest_checkpoint(train_dir).endswith('-%d' % budget)
  scalars = _event_scalars(train_dir)
  # The summary of step k's rate is written as step k + 1.
  rates = [rate for _, rate in sorted(scalars['learning_rate'].items())]
  assert len(rates) == budget
  assert rates[0] == pytest.approx(0.1 if towers == 2 else 2.0)
  assert rates[-1] < rates[budget // 2] < rates[0]
  assert rates[-1] == pytest.approx(
      rates[0] * 0.5 * (1 + math.cos(math.pi * (budget - 1) / budget)),
      rel=1e-5)
  ratios = [t for t in scalars if t.startswith('trust_ratio/')]
  if '--optimizer=lars' in flags:
    assert sorted(ratios) == ['trust_ratio/%s/weights' % layer for layer in (
        'conv1', 'conv2', 'local3', 'local4', 'softmax_linear')]
    assert 0 < scalars['trust_ratio/conv2/weights'][budget] < 1
  else:
    assert not ratios
  again = train(fake_data_dir, train_dir, *common, script=script)
  assert again.returncode == 0
  assert ('has reached step %d, the end of --train_epochs=0.004 (step %d): '
          'nothing to do. To train on, run again with a higher '
          '--train_epochs.' % (budget, budget)) in again.stdout
  evaluated = evaluate(fake_data_dir, train_dir, tmp_path / 'eval',
                       '--num_examples=16', '--batch_size=16')
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  assert 'precision @ 1 = ' in evaluated.stdout
