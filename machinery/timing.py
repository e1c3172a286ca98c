"""Times benchmark rows in turns: a window of steps each, over and over.

A machine's speed drifts (10-15% within minutes on a shared VM): rows timed
one after the other would differ by the drift. Rows timed in turns, a
window each, --windows times over, drift alike, and the median of each
row's windows stands for it:

  timer = stepper(lambda: sess.run(train_op))   # timer(n): seconds of n
  rates = in_turns({'train': (timer, 128)}, windows=5, steps=50)
"""

from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import time


def stepper(step):
  """Returns a timer that runs step() n times and returns the seconds."""
  def timer(n):
    start = time.time()
    for _ in range(n):
      step()
    return time.time() - start
  return timer


def in_turns(timers, windows, steps, after_each=lambda window, rates: None):
  """Times windows of steps of every row, the rows taking turns.

  Args:
    timers: {row: (timer, examples per step)}, in the order to take turns.
    windows: how many windows each row runs.
    steps: steps per window.
    after_each: called after each round of windows, with its index and the
      rates so far (the benchmark measures its peaks there, and says how
      far it is).

  Returns:
    {row: examples/sec of each window}.
  """
  rates = {name: [] for name in timers}
  for window in range(windows):
    for name, (timer, examples_per_step) in timers.items():
      rates[name].append(steps * examples_per_step / timer(steps))
    after_each(window, rates)
  return rates
