"""The command line the scripts share (cifar10_session.py): --help lists
the flags, booleans parse every form, a mistake is one line."""

import os
import re

from absl.testing import flagsaver
import pytest

import cifar10
import cifar10_eval  # pylint: disable=unused-import
from conftest import error_lines, run_script

FLAGS = cifar10.FLAGS

DOCUMENTED = {
    'cifar10_train.py': ['batch_size', 'data_dir', 'use_fp16', 'train_dir',
                         'max_steps', 'log_device_placement',
                         'log_frequency', 'data_url', 'loss_scale',
                         'data_format', 'xla'],
    'cifar10_multi_gpu_train.py': ['batch_size', 'data_dir', 'use_fp16',
                                   'train_dir', 'max_steps', 'num_gpus',
                                   'log_device_placement', 'virtual_cpus',
                                   'variable_update', 'xla'],
    'cifar10_distributed_train.py': ['job_name', 'task_index', 'ps_hosts',
                                     'worker_hosts', 'sync_replicas',
                                     'num_gpus', 'batch_size', 'train_dir',
                                     'max_steps', 'stall_report_secs'],
    'cifar10_eval.py': ['batch_size', 'data_dir', 'use_fp16', 'eval_dir',
                        'eval_data', 'checkpoint_dir', 'eval_interval_secs',
                        'num_examples', 'run_once'],
}


@pytest.mark.parametrize('script', sorted(DOCUMENTED))
def test_help_lists_every_flag_with_default(script):
  result = run_script(script, '--help')
  assert result.returncode == 0
  assert 'Traceback' not in result.stderr
  for name in DOCUMENTED[script]:
    assert '--' + name in result.stdout or '--[no]' + name in result.stdout
  assert "(default: '128')" in result.stdout
  if script == 'cifar10_multi_gpu_train.py':
    assert "(default: '1000000')" in result.stdout
  if script == 'cifar10_train.py':
    assert "(default: '100000')" in result.stdout


@pytest.mark.parametrize('argv,expected', [
    (['--run_once'], True),
    (['--run_once=true'], True),
    (['--run_once=false'], False),
    (['--run_once=False'], False),
    (['--norun_once'], False),
    ([], False),
])
def test_boolean_flags_parse_every_form(argv, expected):
  with flagsaver.flagsaver():
    FLAGS.unparse_flags()
    FLAGS(['cifar10_eval.py'] + argv)
    assert FLAGS.run_once is expected


def test_script_flags_parse_with_model_flags():
  with flagsaver.flagsaver():
    FLAGS.unparse_flags()
    FLAGS(['cifar10_eval.py', '--batch_size=7', '--use_fp16=false',
           '--eval_data=train_eval', '--num_examples=33'])
    assert (FLAGS.batch_size, FLAGS.use_fp16, FLAGS.eval_data,
            FLAGS.num_examples) == (7, False, 'train_eval', 33)


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
     '<test|train_eval>'),
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
def test_bad_flag_is_one_line(script, arg, message):
  result = run_script(script, *arg.split())
  assert result.returncode == 2
  assert error_lines(result.stderr) == ['Error: %s. See --help.' % message]
  assert 'Traceback' not in result.stderr


@pytest.mark.parametrize('args,message', [
    (['--task_index=0'],
     "Give this task's job: --job_name=ps or --job_name=worker."),
    (['--job_name=worker'],
     'Give the cluster: --ps_hosts=host:port,... and '
     '--worker_hosts=host:port,...'),
    (['--job_name=worker', '--task_index=2', '--ps_hosts=127.0.0.1:1',
      '--worker_hosts=127.0.0.1:2,127.0.0.1:3'],
     '--task_index=2, but --worker_hosts lists 2 task(s).'),
    (['--job_name=ps', '--ps_hosts=127.0.0.1:1', '--worker_hosts=127.0.0.1:2',
      '--variable_update=replicated'],
     'Distributed training keeps the variables on the ps tasks: use '
     '--variable_update=parameter_server.'),
])
def test_impossible_cluster_is_one_line(fake_data_dir, args, message):
  result = run_script('cifar10_distributed_train.py',
                      '--data_dir=' + fake_data_dir, *args)
  assert result.returncode == 1
  assert error_lines(result.stderr) == ['Error: ' + message]


def test_stray_argument_is_one_line():
  result = run_script('cifar10_train.py', 'oops')
  assert result.returncode == 1
  assert error_lines(result.stderr) == [
      'Error: Unexpected arguments oops. See --help.']


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


@pytest.mark.parametrize('damage,message', [
    ('missing', r'Error: Failed to find file: .*data_batch_4\.bin\. '),
    ('truncated', r'Error: Data file .*data_batch_4\.bin has 6246 bytes, '
                  r'not a positive multiple of the 3073-byte'),
    ('label', r'Error: Data file .*data_batch_4\.bin: record 1 has label '
              r'byte 200'),
])
def test_bad_data_is_one_line(fake_data_dir, tmp_path, damage, message):
  path = os.path.join(fake_data_dir, 'cifar-10-batches-bin',
                      'data_batch_4.bin')
  if damage == 'missing':
    os.remove(path)
  elif damage == 'truncated':
    with open(path, 'r+b') as f:
      f.truncate(3073 * 2 + 100)
  else:
    with open(path, 'r+b') as f:
      f.seek(3073)
      f.write(bytes([200]))
  result = run_script('cifar10_train.py', '--data_dir=' + fake_data_dir,
                      '--train_dir=' + str(tmp_path / 'train'))
  assert result.returncode == 1
  lines = error_lines(result.stderr)
  assert len(lines) == 1 and 'Traceback' not in result.stderr
  assert re.match(message, lines[0]), lines[0]
