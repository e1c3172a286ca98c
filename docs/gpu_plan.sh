#!/usr/bin/env bash
# The GPU plan of docs/gpu.md in one command, for a lent GPU machine whose
# time is short: each stage runs only if the seconds it needs are left,
# under a timeout that keeps the whole plan inside SECONDS, and a line
# says how each ended (tee the output into OUT/log); the runs' curves,
# logs and pictures go to OUT/runs.tar.gz.
#
#   source /tmp/site/env.sh              # TensorFlow with the GPU (gpu-kit)
#   bash docs/gpu_plan.sh OUT SECONDS [STAGE ...] 2>&1 | tee OUT/log
#
# Stages, in this order (all when none is named): info, gpu_tests, bench,
# t2t80, towers, t2t83, variants, costs, profile, precision2k, suite; and,
# named alone, each seed of $PLAN_SEEDS (by default 1 then 2) of eight
# towers as eight virtual GPUs: t2t83x8 (to 83%, their 180-epoch recipe),
# ceil8_split and ceil8 (the ceiling, #66: the same recipe over 256 epochs,
# the examples of the tutorial's 100,000 one-tower steps, never stopped
# early; on the held-out split, then on the test set); and ceil1, one
# tower's ceiling: its 83% recipe over the same 256 epochs (100,000 steps),
# with summaries every 1,000 steps, not 100 (the same training; the
# tutorial's histograms, computed on the CPU, slow a GPU's step).
# The data: $CIFAR10_ARCHIVE, the real CIFAR-10 archive, unpacked into
# /tmp/cifar10_data ($PLAN_DATA); the runs in /tmp/gpu_runs ($PLAN_RUNS),
# where a rerun resumes each run of t2t80, t2t83 and the ceiling stages.
# QUICK=1 shrinks every stage (a dry run of the plan itself, on a CPU).
set -uo pipefail
quick=${QUICK:-0}
data=${PLAN_DATA:-/tmp/cifar10_data}   # the data_dir (unpacked there if empty)
runs=${PLAN_RUNS:-/tmp/gpu_runs}       # the runs' directories
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-1}
# The traced step is off the summaries' schedule (every 100 steps), whose
# histograms on the CPU would fill its picture.
steps=200 windows=3 warmup=50 tsteps=400 trace=250 csteps=2000
[ "$quick" = 1 ] && steps=5 windows=1 warmup=2 tsteps=20 trace=15 csteps=300
bench_rows=train,train_bf16,train_held,multi1,multi2,split,split_bf16,input,eval
# One tower's recipes: to 80% (README's quick start) and to 83% (#66), the
# latter less its budget: 90 epochs to 83%, 256 for the ceiling.
r80="--optimizer=momentum --nesterov --lr_schedule=linear --initial_learning_rate=0.04 --train_epochs=28"
r1="--optimizer=momentum --nesterov --lr_schedule=linear --initial_learning_rate=0.04 --label_smoothing=0.1 --conv_weight_decay=0.002 --moving_average_decay=0.999"
r83="$r1 --train_epochs=90"
# Eight towers' recipe to 83% (#66, docs/scaling.md), less its budget:
# 180 epochs (8,790 steps of 1,024 examples) to 83%, 256 for the ceiling.
r8="--optimizer=lars --lars_trust_coefficient=0.3 --nesterov --lr_schedule=cosine --initial_learning_rate=0.005 --learning_rate_scaling=linear --warmup_epochs=2 --label_smoothing=0.1 --conv_weight_decay=0.002 --moving_average_decay=0.999"
t80=0.80 t83=0.83 e83x8=180 e_ceiling=256
# The runs train in bfloat16 (a GPU's tensor cores); QUICK's in float32,
# as a CPU without AVX512_BF16 or AMX runs bfloat16 many times slower.
# QUICK's eight towers keep LARS, not the warm-up, longer than 0.1 epochs.
bf16=--use_bf16
[ "$quick" = 1 ] && bf16="" r80="--train_epochs=0.1" r83="--train_epochs=0.1" r1="" t80=0.2 t83=0.2 \
  r8="--optimizer=lars --lars_trust_coefficient=0.3" e83x8=0.1 e_ceiling=0.1

info() {
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  nproc; grep -m1 'model name' /proc/cpuinfo
  python3 -c "import tensorflow as tf; print(tf.__version__, tf.config.list_physical_devices('GPU'))"
}

bench() {
  python3 benchmark.py --data_dir=$data --rows=$bench_rows --steps=$steps \
    --windows=$windows --warmup=$warmup
}

t2t() {  # NAME TARGET RECIPE: one tower, bfloat16, the evaluator beside.
  python3 docs/time_to_target.py --trainer=cifar10_train.py --seed=1 \
    --data_dir=$data --out_dir=$runs/$1 --target=$2 --recipe="$3" \
    --extra="$bf16"
  tail -n 3 $runs/$1/curve.csv
}

seeds() {  # NAME FLAG...: docs/time_to_target.py with FLAGs, each seed,
  # in its own --out_dir, the evaluator on the CPU: beside eight virtual
  # GPUs it could not make its cuBLAS handle on an H100 (docs/gpu.md).
  local name=$1 seed; shift
  for seed in ${PLAN_SEEDS:-1 2}; do
    python3 docs/time_to_target.py --seed=$seed --data_dir=$data \
      --out_dir=$runs/${name}_s$seed --evaluator_on_cpu "$@"
    tail -n 2 $runs/${name}_s$seed/curve.csv
  done
}

t2t8() {  # NAME EPOCHS TARGET [FLAG]: eight towers on eight virtual GPUs,
  # bfloat16, FLAG (--held_out) to docs/time_to_target.py.
  seeds $1 --towers=8 --target=$3 --recipe="$r8 --train_epochs=$2" \
    --extra="$bf16" ${4:-}
}

ceil1() {  # One tower's ceiling: its 83% recipe over the ceiling's budget.
  seeds ceil1 --trainer=cifar10_train.py --target=1.0 \
    --recipe="$r1 --train_epochs=$e_ceiling" \
    --extra="$bf16 --save_summaries_steps=1000"
}

towers() {  # Two virtual GPUs, both updates, a traced step, the evaluator.
  for update in parameter_server replicated; do
    rm -rf $runs/v2_$update  # a run of its own, not a resumed one
    python3 cifar10_multi_gpu_train.py --num_gpus=2 --virtual_gpus \
      --variable_update=$update --data_dir=$data --train_dir=$runs/v2_$update \
      --max_steps=$tsteps --log_frequency=100 --trace_steps=$trace
    python3 docs/plot_timeline.py $runs/v2_$update/trace-step-$trace.json \
      --out=$runs/timeline_v2_$update.png \
      --title="two virtual GPUs of one $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $update"
  done
  python3 cifar10_eval.py --data_dir=$data --checkpoint_dir=$runs/v2_parameter_server \
    --eval_dir=$runs/v2_eval --run_once
}

variants() {  # The train row with each speed option.
  for opts in --data_format=NHWC --use_fp16 --xla "--use_bf16 --xla"; do
    echo "-- train row with $opts"
    python3 benchmark.py --data_dir=$data --rows=train --steps=$steps \
      --windows=$windows --warmup=$warmup $opts | grep -E '^\| train|100K'
  done
}

costs() {  # The trainer's step beside the benchmark's: summaries, --seed.
  for opts in "" --save_summaries_steps=1000000 --seed=1; do
    rm -rf $runs/costs
    python3 cifar10_train.py --data_dir=$data --train_dir=$runs/costs \
      --max_steps=$csteps --log_frequency=100 $opts 2>&1 |
      grep -o '([0-9.]* examples/sec' | tail -n +3 | tr -d '(' | sort -n |
      awk -v o="${opts:-the defaults}" '{r[NR]=$1} END {print "cifar10_train.py with " o ": median " r[int((NR+1)/2)] " examples/sec (" r[1] ".." r[NR] "), " NR " log lines"}'
  done
}

profile() {  # Where the one-tower step's time goes on the GPU.
  python3 benchmark.py --data_dir=$data --rows=train,multi1 --steps=$steps \
    --windows=$windows --warmup=$warmup --profile_steps=10
}

precision2k() {  # The tutorial's 2,000 steps in each precision.
  for opts in "" --use_bf16 --use_fp16; do
    rm -rf $runs/p2k
    python3 cifar10_train.py --data_dir=$data --train_dir=$runs/p2k \
      --max_steps=$csteps --log_frequency=1000 $opts > /dev/null 2>&1
    echo "${opts:-float32}: $(python3 cifar10_eval.py --data_dir=$data \
      --checkpoint_dir=$runs/p2k --eval_dir=$runs/p2k_eval --run_once 2>&1 |
      grep -o 'precision @ 1 = [0-9.]*')"
  done
}

# A stage's command runs in a child of this script (timeout runs commands,
# not functions): gpu_plan.sh --do FUNCTION ARGS.
if [ "${1:-}" = --do ]; then shift; "$@"; exit; fi

usage='usage: gpu_plan.sh OUT SECONDS [STAGE ...]'
out=${1:?$usage}
budget=${2:?$usage}
shift 2
plan='info gpu_tests bench t2t80 towers t2t83 variants costs profile precision2k suite'
all="$plan t2t83x8 ceil8_split ceil8 ceil1"  # the last four run only when named
stages=${*:-$plan}
# A wrong stage or budget is found before anything runs on the lent time.
[[ $budget =~ ^[0-9]+$ ]] || { echo "Error: SECONDS must be a whole number of seconds, not '$budget'. $usage"; exit 2; }
for s in $stages; do
  [[ " $all " == *" $s "* ]] || { echo "Error: no stage '$s'; the stages are: $all."; exit 2; }
done
start=$(date +%s)
mkdir -p "$out" "$data" "$runs"
[ -d "$data/cifar-10-batches-bin" ] || tar -C "$data" -xzf "${CIFAR10_ARCHIVE:?set CIFAR10_ARCHIVE}"

left() { echo $(( budget - ($(date +%s) - start) )); }

# stage NAME SECONDS COMMAND...: runs COMMAND if SECONDS are left, for at
# most what is left less 15 s (to pack the runs), and says how it ended.
stage() {
  local name=$1 need=$2 l t0 rc
  shift 2
  l=$(left)
  if (( l < need )); then
    echo "== $name: skipped ($l s left, it needs $need)"
    return
  fi
  echo "== $name: $(date +%T), $l s left: $*"
  t0=$(date +%s)
  timeout -k 5 $(( l - 15 )) "$@"
  rc=$?
  echo "== $name: exit $rc after $(( $(date +%s) - t0 )) s"
}

me="bash $0 --do"
for s in $stages; do
  case $s in
    info) stage info 20 $me info ;;
    gpu_tests) stage gpu_tests 60 python3 -m pytest -q -n 4 -rfEs tests/test_gpu.py ;;
    bench) stage bench 100 $me bench ;;
    t2t80) stage t2t80 90 $me t2t t80 $t80 "$r80" ;;
    t2t83) stage t2t83 180 $me t2t t83 $t83 "$r83" ;;
    t2t83x8) stage t2t83x8 180 $me t2t8 t83x8 $e83x8 $t83 ;;
    ceil8_split) stage ceil8_split 420 $me t2t8 ceil8_held $e_ceiling 1.0 --held_out ;;
    ceil8) stage ceil8 420 $me t2t8 ceil8 $e_ceiling 1.0 ;;
    ceil1) stage ceil1 480 $me ceil1 ;;
    towers) stage towers 60 $me towers ;;
    variants) stage variants 80 $me variants ;;
    costs) stage costs 90 $me costs ;;
    profile) stage profile 60 $me profile ;;
    precision2k) stage precision2k 90 $me precision2k ;;
    suite) stage suite 120 python3 -m pytest -v -n ${SUITE_WORKERS:-12} -p no:cacheprovider tests ;;
  esac
done
# The curves, logs and pictures of the runs (no checkpoints).
tar -C $runs -czf "$out/runs.tar.gz" --exclude='model.ckpt-*' --exclude='events.*' \
  --exclude=checkpoint --exclude='graph.pbtxt' . 2>/dev/null
echo "== done: $(( $(date +%s) - start )) s"
