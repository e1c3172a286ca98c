"""What a recipe's optimizer costs a step: SGD, momentum and LARS, A/B.

Builds cifar10_train.py's step three times in one process, with the
tutorial's SGD, the one-tower recipe (momentum, Nesterov, a linear decay)
and LARS, runs each --warmup steps, then times them taking turns, window
by window (machinery/timing.py), so that the machine's drift slows each
alike. Prints each one's median examples/sec, and momentum's and LARS's
speed over SGD's window by window (median and min..max).

Usage:
  python docs/optimizer_cost.py --data_dir=D [--bf16] [--windows=8 --steps=40]
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
# pylint: disable=g-import-not-at-top,wrong-import-position
import cifar10
import cifar10_train
from machinery import hardware
from machinery import options
from machinery import recipe
from machinery import timing
import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
BATCH = 128

RECIPES = {
    'sgd': recipe.TUTORIAL,
    'momentum': recipe.TUTORIAL._replace(
        optimizer='momentum', nesterov=True, lr_schedule='linear',
        initial_learning_rate=0.04, train_epochs=28),
    'lars': recipe.TUTORIAL._replace(
        optimizer='lars', nesterov=True, trust_coefficient=0.3,
        lr_schedule='cosine', initial_learning_rate=0.04, train_epochs=50),
}


def timer(data_dir, the_recipe, opts, warmup):
  """Returns a timer of the recipe's training step, warmed up."""
  graph = tf.Graph()
  with graph.as_default():
    with tf.device('/cpu:0'):
      batch = cifar10.distorted_inputs(data_dir, BATCH, opts)
    train_op, _, _ = cifar10_train.build_train_op([batch], [''], the_recipe,
                                                  opts)
    inits = [tf1.global_variables_initializer(),
             tf1.local_variables_initializer()]
  sess = tf1.Session(graph=graph, config=hardware.session_config())
  sess.run(inits)
  step = timing.stepper(lambda: sess.run(train_op))
  step(warmup)
  return step


def main():
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--data_dir', required=True)
  p.add_argument('--bf16', action='store_true')
  p.add_argument('--windows', type=int, default=8)
  p.add_argument('--steps', type=int, default=40)
  p.add_argument('--warmup', type=int, default=20)
  args = p.parse_args()
  opts = options.DEFAULT._replace(use_bf16=args.bf16)
  timers = {name: (timer(args.data_dir, r, opts, args.warmup), BATCH)
            for name, r in RECIPES.items()}
  rates = timing.in_turns(timers, windows=args.windows, steps=args.steps)
  for name, values in rates.items():
    print('%s: median %.1f examples/sec (%.1f..%.1f)' % (
        name, np.median(values), min(values), max(values)))
  for name in ('momentum', 'lars'):
    pairs = [a / b for a, b in zip(rates[name], rates['sgd'])]
    print('%s / sgd per window: median %.3f (%.3f..%.3f)' % (
        name, np.median(pairs), min(pairs), max(pairs)))


if __name__ == '__main__':
  main()
