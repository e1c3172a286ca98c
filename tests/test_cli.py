"""The command line the scripts share (machinery/cli.py): --help lists
the flags, booleans parse every form, a mistake is one line."""

import gc
import os
import re
import sys

from absl.testing import flagsaver
import numpy as np
import pytest
import tensorflow as tf

import cifar10
import cifar10_distributed_train  # pylint: disable=unused-import
import cifar10_eval  # pylint: disable=unused-import
import cifar10_multi_gpu_train  # pylint: disable=unused-import
import cifar10_train  # pylint: disable=unused-import
import cifar10_input
from conftest import (REPO, error_lines, evaluate, make_fake_data, run_script,
                      write_records)
from machinery import cli
from machinery import errors

tf1 = tf.compat.v1
FLAGS = tf1.flags.FLAGS

DOCUMENTED = {
    'cifar10_predict.py': ['batch_size', 'data_dir', 'checkpoint_dir',
                           'top_k', 'export_dir', 'use_bf16'],
    'cifar10_train.py': ['batch_size', 'data_dir', 'use_fp16', 'train_dir',
                         'max_steps', 'log_device_placement',
                         'log_frequency', 'data_url', 'loss_scale',
                         'data_format', 'xla', 'seed'],
    'cifar10_multi_gpu_train.py': ['batch_size', 'data_dir', 'use_fp16',
                                   'train_dir', 'max_steps', 'num_gpus',
                                   'log_device_placement', 'virtual_gpus',
                                   'variable_update', 'xla', 'seed',
                                   # The recipe's (machinery/recipe.py).
                                   'optimizer', 'momentum', 'nesterov',
                                   'lars_trust_coefficient', 'lr_schedule',
                                   'train_epochs', 'initial_learning_rate',
                                   'warmup_epochs'],
    'cifar10_model_parallel_train.py': ['batch_size', 'data_dir', 'train_dir',
                                        'max_steps', 'virtual_gpus',
                                        'trace_steps'],
    'cifar10_distributed_train.py': ['job_name', 'task_index', 'ps_hosts',
                                     'worker_hosts', 'sync_replicas',
                                     'num_gpus', 'batch_size', 'train_dir',
                                     'max_steps', 'stall_report_secs',
                                     'peer_timeout_secs'],
    'cifar10_eval.py': ['batch_size', 'data_dir', 'use_fp16', 'eval_dir',
                        'eval_data', 'checkpoint_dir', 'eval_interval_secs',
                        'num_examples', 'run_once'],
}


def _help_defaults(script):
  """{flag: default} as the script's --help prints them."""
  result = run_script(script, '--help')
  assert result.returncode == 0
  assert 'Error' not in result.stderr and 'Traceback' not in result.stderr
  assert '--batch_size' in result.stdout
  defaults = {}
  # Each flag starts a line, indented by two spaces: '  --[no]xla: ...'.
  for entry in re.split(r'\n  --(?:\[no\])?(?=\w+:)', result.stdout)[1:]:
    name = entry.split(':')[0]
    default = re.search(r"\(default: '([^']*)'\)", entry)
    defaults[name] = default.group(1) if default else None
  return defaults


# The paragraphs of flags in docs/usage.md, and the scripts that take them;
# a later paragraph's default wins (the multi-GPU trainer's --max_steps).
USAGE_FLAGS = [
    ('**Model flags**', sorted(DOCUMENTED)),
    ('**`cifar10_train.py`**', ['cifar10_train.py',
                               'cifar10_multi_gpu_train.py',
                               'cifar10_model_parallel_train.py',
                               'cifar10_distributed_train.py']),
    ('**`cifar10_multi_gpu_train.py`**', ['cifar10_multi_gpu_train.py',
                                         'cifar10_distributed_train.py']),
    ('**`cifar10_model_parallel_train.py`**',
     ['cifar10_model_parallel_train.py']),
    ('**`cifar10_eval.py`**', ['cifar10_eval.py']),
    ('`--top_k` (3)', ['cifar10_predict.py']),
]


def _documented_defaults():
  """{script: {flag: default}} of the flags docs/usage.md gives a default.

  A default is what its parentheses start with: a number, true or false,
  or a `value`; prose ("the official archive") promises no value.
  """
  with open(os.path.join(REPO, 'docs', 'usage.md')) as f:
    paragraphs = f.read().split('\n\n')
  promised = {}
  for start, scripts in USAGE_FLAGS:
    paragraph, = [p for p in paragraphs if p.startswith(start)]
    for name, default in re.findall(r'`--(\w+)` \(([^)]*)\)',
                                    paragraph.replace('\n', ' ')):
      literal = re.match(r'`([^`]*)`|(-?[\d.]+|true|false)\b', default)
      for script in scripts:
        promised.setdefault(script, {})[name] = (
            literal.group(1) or literal.group(2) if literal else None)
  return promised


@pytest.mark.parametrize('script', sorted(DOCUMENTED))
def test_help_lists_every_flag_with_its_documented_default(script):
  defaults = _help_defaults(script)
  assert set(DOCUMENTED[script]) <= set(defaults), script
  promised = _documented_defaults()[script]
  for name, default in promised.items():
    assert name in defaults, name
    if default is not None:
      assert defaults[name] == default, (name, defaults[name], default)


def _save_two_faced_model(checkpoint_dir):
  """Saves a checkpoint whose trained weights say 1 for every image and
  whose moving averages say 0."""
  with tf.Graph().as_default():
    global_step = tf1.train.get_or_create_global_step()
    cifar10.inference(tf.zeros([1, 24, 24, 3]))
    tf1.train.ExponentialMovingAverage(
        cifar10.MOVING_AVERAGE_DECAY).apply(tf1.trainable_variables())
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      for v in tf1.global_variables():
        if v.dtype.base_dtype == tf.float32:
          value = np.zeros(v.shape.as_list(), np.float32)
          if v.op.name.startswith('softmax_linear/biases'):
            value[0 if 'ExponentialMovingAverage' in v.op.name else 1] = 10
          v.load(value, sess)
      tf1.train.Saver().save(sess, os.path.join(checkpoint_dir, 'model.ckpt'),
                             global_step=global_step)


@pytest.mark.parametrize('argv,raw', [
    (['--raw_weights'], True),
    (['--raw_weights=True'], True),
    (['--raw_weights=False'], False),  # The tutorial's argparse: True.
    (['--noraw_weights'], False),
])
def test_a_scripts_boolean_flag_works_in_every_form(tmp_path, argv, raw):
  """cifar10_eval.py on test images all labelled 1, of a model whose own
  weights say 1 and whose moving averages say 0: --raw_weights in each
  form the docs promise decides which it evaluates."""
  data_dir = str(tmp_path / 'data')
  written = make_fake_data(data_dir, records_per_file=10)
  for name, (_, images) in written.items():
    write_records(os.path.join(data_dir, cifar10_input.BATCHES_DIR, name),
                  [1] * 10, images)
  _save_two_faced_model(str(tmp_path / 'model'))
  result = evaluate(data_dir, str(tmp_path / 'model'), tmp_path / 'eval',
                    '--num_examples=10', '--batch_size=10', *argv)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip().endswith(
      'precision @ 1 = %s' % ('1.000 (raw weights)' if raw else '0.000'))


def test_a_boolean_flag_given_a_word_is_one_line_and_exit_2(capsys):
  with flagsaver.flagsaver():
    FLAGS.unparse_flags()
    with pytest.raises(SystemExit) as exited:
      cli._parse_flags(['cifar10_eval.py', '--run_once=maybe'])  # pylint: disable=protected-access
  FLAGS.unparse_flags()
  assert exited.value.code == 2
  err = capsys.readouterr().err
  assert err.startswith('Error: flag --run_once=maybe: ') and err.endswith(
      '. See --help.\n') and err.count('\n') == 1, err


def test_a_directory_flag_naming_a_file_or_under_one_is_one_line(
    tmp_path, parsed_flags):
  """The check every script runs on its directory flags before any work
  (tests/test_hardening.py runs it in each script, on one flag or two):
  a file, and a path under a file, each named; a directory, or one that
  can be made, passes; nothing is created."""
  a_file = tmp_path / 'a_file'
  a_file.write_text('not a directory')
  under = str(a_file / 'sub' / 'dir')
  assert cli._path_problem(str(tmp_path)) is None  # pylint: disable=protected-access
  assert cli._path_problem(str(tmp_path / 'new' / 'dir')) is None  # pylint: disable=protected-access
  for name in ('data_dir', 'eval_dir', 'checkpoint_dir'):
    for bad, problem in ((str(a_file), 'it is a file, not a directory'),
                         (under, '%s is a file, so no directory can be '
                          'made under it' % a_file)):
      with flagsaver.flagsaver(**{name: bad}):
        with pytest.raises(errors.UsageError) as raised:
          cli.check_path_flags()
      assert str(raised.value) == (
          '--%s=%s: %s. Give a directory there.' % (name, bad, problem))
  assert sorted(os.listdir(tmp_path)) == ['a_file']


# Each script's command line is parsed by one function, cli._parse_flags,
# run below in a script for one bad flag of each script, and in this
# process (every script's flags defined) for the others: the same parse and
# line, without starting TensorFlow again for each.
RUN_IN_A_SCRIPT = {('cifar10_train.py', '--bogus=1'),
                   ('cifar10_multi_gpu_train.py', '--num_gpus=0'),
                   ('cifar10_eval.py', '--eval_data=validation'),
                   ('cifar10_distributed_train.py',
                    '--worker_hosts=a:1,b:port')}


@pytest.mark.parametrize('script,arg,message', [
    ('cifar10_train.py', '--batch_size=0',
     'flag --batch_size=0: 0 is not a positive integer'),
    ('cifar10_train.py', '--max_steps=-5',
     'flag --max_steps=-5: -5 is not a positive integer'),
    ('cifar10_train.py', '--bogus=1', "Unknown command line flag 'bogus'"),
    ('cifar10_multi_gpu_train.py', '--num_gpus=0',
     'flag --num_gpus=0: 0 is not a positive integer'),
    ('cifar10_train.py', '--loss_scale=abc',
     "flag --loss_scale=abc: --loss_scale must be 'dynamic' or a positive "
     'number'),
    ('cifar10_train.py', '--data_format=NHCW',
     'flag --data_format=NHCW: value should be one of <auto|NHWC|NCHW>'),
    ('cifar10_multi_gpu_train.py', '--variable_update=mirrored',
     'flag --variable_update=mirrored: value should be one of '
     '<parameter_server|replicated>'),
    ('cifar10_eval.py', '--eval_data=validation',
     'flag --eval_data=validation: value should be one of '
     '<test|train_eval|held_out>'),
    ('cifar10_eval.py', '--eval_interval_secs=0',
     'flag --eval_interval_secs=0: 0 is not a positive integer'),
    ('cifar10_eval.py', '--num_examples=abc',
     "flag --num_examples=abc: invalid literal for int() with base 10: "
     "'abc'"),
    ('cifar10_train.py', '--use_fp16 --use_bf16',
     'flags use_fp16=True, use_bf16=True: --use_fp16 and --use_bf16 exclude '
     'each other: choose one'),
    ('cifar10_distributed_train.py', '--ps_hosts=localhost',
     "flag --ps_hosts=['localhost']: give each task as host:port, the port "
     'a number 1-65535'),
    ('cifar10_distributed_train.py', '--worker_hosts=a:1,b:port',
     "flag --worker_hosts=['a:1', 'b:port']: give each task as host:port, "
     'the port a number 1-65535'),
])
def test_bad_flag_is_one_line(script, arg, message, capsys):
  if (script, arg) in RUN_IN_A_SCRIPT:
    result = run_script(script, *arg.split())
    code, err = result.returncode, result.stderr
  else:
    with flagsaver.flagsaver():
      FLAGS.unparse_flags()
      with pytest.raises(SystemExit) as exited:
        cli._parse_flags([script] + arg.split())  # pylint: disable=protected-access
    FLAGS.unparse_flags()
    code, err = exited.value.code, capsys.readouterr().err
  assert code == 2
  assert error_lines(err) == ['Error: %s. See --help.' % message]
  assert 'Traceback' not in err


def test_stray_argument_is_one_line():
  result = run_script('cifar10_train.py', 'oops')
  assert result.returncode == 1
  assert error_lines(result.stderr) == [
      'Error: Unexpected arguments oops. See --help.']


def test_main_runs_with_what_the_script_imported_frozen(monkeypatch):
  """run_main freezes what is loaded before main (TensorFlow, here with
  pytest), so that Python's collector skips it from then on."""
  monkeypatch.setattr(sys, 'argv', ['cifar10_train.py'])
  was_frozen = gc.get_freeze_count()  # By conftest, as run_main does.
  gc.unfreeze()
  frozen = []

  def main(argv):  # pylint: disable=unused-argument
    frozen.append(gc.get_freeze_count())
    return 0
  try:
    with pytest.raises(SystemExit) as exit_status:
      cli.run_main(main)
  finally:
    gc.unfreeze()
    if was_frozen:
      gc.freeze()
  assert exit_status.value.code == 0
  # Every object the collector tracked: with TensorFlow loaded, some
  # 350,000; none when nothing is frozen.
  assert frozen[0] > 100000, frozen


def test_too_many_eval_examples_is_one_line(fake_data_dir):
  result = run_script('cifar10_eval.py', '--data_dir=' + fake_data_dir,
                      '--num_examples=10001', '--run_once')
  assert result.returncode == 1
  assert error_lines(result.stderr) == [
      'Error: --num_examples=10001 is more than the 10000 examples of '
      '--eval_data=test.']


def test_missing_data_is_one_line(tmp_path):
  result = run_script('cifar10_train.py', '--data_dir=' + str(tmp_path),
                      '--data_url=file://' + str(tmp_path / 'none.tar.gz'),
                      '--train_dir=' + str(tmp_path / 'train'))
  assert result.returncode == 1
  lines = error_lines(result.stderr)
  assert len(lines) == 1 and 'Traceback' not in result.stderr
  assert lines[0].startswith('Error: Failed to download file://')
  assert not (tmp_path / 'train').exists()


# Damage to a data file, and the line each is.
BAD_DATA = [
    ('missing', r'Failed to find file: .*data_batch_4\.bin\. '),
    ('truncated', r'Data file .*data_batch_4\.bin has 6246 bytes, not a '
                  r'positive multiple of the 3073-byte'),
    ('label', r'Data file .*data_batch_4\.bin: record 1 has label byte 200'),
]


def _damage(data_dir, damage):
  """Damages data_batch_4.bin of data_dir as BAD_DATA names."""
  path = os.path.join(data_dir, 'cifar-10-batches-bin', 'data_batch_4.bin')
  if damage == 'missing':
    os.remove(path)
  elif damage == 'truncated':
    with open(path, 'r+b') as f:
      f.truncate(3073 * 2 + 100)
  else:
    with open(path, 'r+b') as f:
      f.seek(3073)
      f.write(bytes([200]))


@pytest.mark.parametrize('damage,message', BAD_DATA)
def test_bad_data_is_one_line(fake_data_dir, damage, message):
  """The check the trainers run on the training files before any work,
  in-process; the next test runs one in a script."""
  _damage(fake_data_dir, damage)
  with pytest.raises(errors.DataError) as raised:
    cifar10_input.data_files(fake_data_dir, False)
  assert re.match(message, str(raised.value)), str(raised.value)


def test_bad_data_in_the_script_is_one_line(fake_data_dir, tmp_path):
  damage, message = BAD_DATA[1]
  _damage(fake_data_dir, damage)
  result = run_script('cifar10_train.py', '--data_dir=' + fake_data_dir,
                      '--train_dir=' + str(tmp_path / 'train'))
  assert result.returncode == 1
  lines = error_lines(result.stderr)
  assert len(lines) == 1 and 'Traceback' not in result.stderr
  assert re.match('Error: ' + message, lines[0]), lines[0]
