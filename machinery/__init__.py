"""Holds the machinery the CIFAR-10 scripts run on, a module per job.

The scripts at the top of the repository are the lessons and the programs
you run; this package holds what they stand on:

  cli             the command line: flags in, one `Error:` line out
  errors          what stops a script, each error named for what happened
  console         TensorFlow's own chatter, kept off the console
  writes          a write that failed (a full disk): one line, no debris
  environment     how TensorFlow starts: its logging, its oneDNN kernels
  download        getting the CIFAR-10 archive into --data_dir
  session         the trainers' session: resume, lock, hooks, failures
  lock            one trainer per --train_dir
  step_hooks      what runs at every step: the step line, NaN, Ctrl-C
  checkpoints     the newest readable checkpoint; moved run directories
  memory          whether a step fits in memory, before the first
  summaries       TensorBoard summaries tagged the tutorial's way
  hardware        GPUs, where the towers go on them; session configs
  options         the options for speed: precision, layout, XLA
  recipe          how the model trains: the rate's schedule, the optimizer
  lars            LARS, the optimizer of large batches
  noise_scale     the gradient noise scale, from the towers' gradients
  lrn             the tutorial's LRN, made fast on CPUs
  cluster         a distributed task's cluster, from flags or TF_CONFIG
  ps_task         what a parameter-server task does: serve until done
  worker_session  a distributed worker's part in the session
  probes          what benchmark.py measures against: matmul peaks, oneDNN
  profiler        where a step's time goes, by layer and op
  timing          rows timed in turns, so that a drifting machine slows all
  row_process     benchmark rows in a child process of other settings

Importing the package sets up TensorFlow's environment before TensorFlow
starts (environment.py), so a script imports it before TensorFlow.
"""

from machinery import environment

environment.set_up()
