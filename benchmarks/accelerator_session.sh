#!/usr/bin/env bash
# The figures that need an accelerator, in one bounded run on a machine with a GPU
# (or TPU): a first and a second `tpu101` run against the TPU 101 tutorial's whole program
# with every preset's compile (`tpu_time_to_result.py`), the accelerator test lane
# (`pytest -m accelerator`, in one process), a grayscale first layer's formulations side
# by side (`first_conv.py`: `speedrun` with 8 seeds, `record`, `cnn`), the `speedrun`
# preset's time per model (8 seeds in one program, and one alone), jaxmnist's epoch
# against the tutorial's, the
# memory estimate against the allocator's peak (8 CNN and 8 `speedrun` seeds, with and
# without batch norm), `jaxmnist bench --quick`, and profiles of the `cnn` and `record`
# steps (`jaxmnist profile`, as many steps as one of a run's calls), and the record
# presets' whole runs (`record.py`, from an empty compilation cache). Run from anywhere.
# Every record is named as `benchlib.results` names one, <date>_<commit>_<machine> (the
# accelerator's kind), in its benchmark's folder: under $OUT if set (copy its folders into
# benchmarks/results/), else under benchmarks/results/ itself: six benchmark JSONs,
# bench_tpu101/'s json, png and html, profile_cnn/ and profile_record/ (profile.json), and
# in accelerator_session/ the session's log and the lane's JUnit XML. What no record keeps
# (the profiles' traces, bench's own folder) goes to raw/ under $OUT, else to a scratch
# folder the log names.
#
#   bash benchmarks/accelerator_session.sh
#   STEPS="speedrun tutorial" bash benchmarks/accelerator_session.sh   # some steps only
#
# Steps: time-to-result tests first-conv speedrun tutorial memory bench profile record.
# Every benchmark runs
# its programs one after another, never two at once, so a chip that one program at a time
# can hold (a TPU) serves them all.
#
# The machine needs Python with JAX for its accelerator, Optax, Orbax and the rest of
# jaxmnist's dependencies. Pure-Python ones it lacks can travel as wheels in .whl/
# (installed with --no-deps into a scratch folder). Real MNIST and Fashion-MNIST (the
# `codelab` and `fashion_record` presets) come from $JAXMNIST_DATA_DIR, else from .data/
# (a folder holding mnist/ and fashion-mnist/); both are verified before any step runs.
# On a machine with pip, with both folders ignored by git:
#
#   pip download --no-deps -d .whl pooch platformdirs tensorboardX
#   mkdir -p .data && cp -r ../shared/datasets/{mnist,fashion-mnist} .data/
#
# Each step has its own time limit (STEP_LIMIT seconds, default 240); a failed step is
# logged and the next one runs.
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  "$py" -m pip install -q --upgrade --no-index --no-deps --no-compile --target /tmp/jaxmnist-site .whl/*.whl
  export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}/tmp/jaxmnist-site"  # after what the machine names
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export JAXMNIST_DATA_DIR="${JAXMNIST_DATA_DIR:-$PWD/.data}"
# Every dependency the steps import, checked before any device time goes to a step that
# would fail at its first import (a wheel missing or broken on the machine).
missing=$("$py" - <<'EOF'
import importlib
names = ["jax", "optax", "orbax.checkpoint", "matplotlib", "PIL", "scipy", "tqdm", "filelock",
         "flatbuffers", "pooch", "platformdirs", "tensorboardX", "jaxmnist.cli"]
bad = []
for name in names:
    try:
        module = importlib.import_module(name)
        if getattr(module, "__file__", None) is None:  # a folder of that name, no code
            raise ImportError("a namespace package without code")
    except Exception as e:  # noqa: BLE001 -- any failure to import is reported
        bad.append(f"{name} ({type(e).__name__}: {e})")
print("; ".join(bad))
EOF
) || exit 1
if [ -n "$missing" ]; then
  echo "accelerator_session.sh: cannot import: $missing" >&2
  exit 1
fi
ALL_STEPS="time-to-result tests first-conv speedrun tutorial memory bench profile record"
# Both datasets, read and checked (`jaxmnist data verify`: no download, no device), before
# any device time goes to a step that would stop at its first run: every step reads MNIST,
# and time-to-result and record Fashion-MNIST too.
wanted=$(for name in ${STEPS:-$ALL_STEPS}; do [[ " $ALL_STEPS " == *" $name "* ]] && echo "$name"; done)
if [ -n "$wanted" ] && ! verified=$("$py" -m jaxmnist data verify 2>&1); then
  echo "accelerator_session.sh: $(tail -n 1 <<<"$verified")" >&2
  exit 1
fi
# The backend, and the records' name: <date>_<commit>_<machine> (benchlib.results).
read -r backend stem < <("$py" - <<'EOF'
import sys
sys.path.insert(0, "benchmarks")
import jax
from benchlib.results import provenance, record_name
backend = jax.default_backend()
accelerator = jax.devices()[0].device_kind if backend != "cpu" else None
print(backend, record_name(provenance(accelerator)).removesuffix(".json"))
EOF
)
[ -n "${stem:-}" ] || exit 1
out=${OUT:-benchmarks/results}
base=$stem n=1  # a record is never replaced: a second session numbers its own on
while compgen -G "$out/*/$stem.*" >/dev/null || compgen -G "$out/tpu/*/$stem.*" >/dev/null; do
  n=$((n + 1))
  stem="$base~$n"
done
raw=$([ -n "${OUT:-}" ] && echo "$OUT/raw" || mktemp -d)
mkdir -p "$out/accelerator_session" "$raw"
log="$out/accelerator_session/$stem.txt"
{
  date -u
  echo "backend $backend; records: $out/*/$stem.*; traces and bench's folder: $raw"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
  "$py" -c 'import json; from jaxmnist import runtime; print(json.dumps(runtime.environment()))'
} >"$log" 2>&1

# A Python process that opened a TPU can hang in the runtime's teardown at exit (seen on a
# TPU v5e VM): benchmark scripts run through this launcher, which ends the process as the
# jaxmnist CLI ends its own (`cli.end_process`: threads joined, atexit run, no teardown).
launch='import os, runpy, sys, traceback
from jaxmnist.cli import end_process
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
    code = 0
except SystemExit as e:
    if e.code is None or isinstance(e.code, int):
        code = e.code or 0
    else:
        print(e.code, file=sys.stderr)
        code = 1
except BaseException:
    traceback.print_exc()
    code = 1
end_process(code)'

step() {
  local name=$1
  shift
  [[ " ${STEPS:-$ALL_STEPS} " == *" $name "* ]] || return 0
  local shown="$*"
  echo "== $name: ${shown//"$launch"/(launcher)}" | tee -a "$log"
  local start=$SECONDS
  timeout "${STEP_LIMIT:-240}" "$@" >>"$log" 2>&1
  local rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "== $name done in $((SECONDS - start)) s" | tee -a "$log"
  else
    echo "== $name failed (exit $rc) after $((SECONDS - start)) s" | tee -a "$log"
  fi
}

# keep SRC DST: a file a command wrote where no record lives, copied to its record's place.
keep() {
  [ -f "$1" ] || return 0
  mkdir -p "$(dirname "$2")"
  cp "$1" "$2"
}

# First: a user's first run, before anything else has compiled on this machine.
STEP_LIMIT=${TTR_LIMIT:-540} step time-to-result "$py" -c "$launch" benchmarks/tpu_time_to_result.py \
  --out "$out/tpu/time_to_result/$stem.json"
# The accelerator lane, in one process: the chip admits one program at a time.
STEP_LIMIT=${TESTS_LIMIT:-480} step tests "$py" -m pytest -q -p no:cacheprovider -p no:xdist \
  -m accelerator --durations=15 -rfE --junitxml "$out/accelerator_session/${stem}_tests.xml" tests
step first-conv "$py" -c "$launch" benchmarks/first_conv.py --out "$out/first_conv/$stem.json" --runs \
  "--preset speedrun --seeds 8 --epochs 3 train.target_accuracy=null" "--preset record --epochs 3" \
  "--preset cnn --epochs 3"
step speedrun "$py" -c "$launch" benchmarks/cnn_presets.py --presets speedrun --seeds 8 --out "$out/cnn_presets/$stem.json"
step tutorial "$py" -c "$launch" benchmarks/epoch_vs_tutorial.py --runs 2 --out "$out/epoch_vs_tutorial/$stem.json"
step memory "$py" -c "$launch" benchmarks/memory_estimate.py --presets cnn,speedrun --seeds 8 --repeats 1 \
  --out "$out/memory_estimate/$stem.json"
step bench "$py" -m jaxmnist bench --preset tpu101 --quick --out "$raw/bench-tpu101"
for ext in json png html; do keep "$raw/bench-tpu101/bench.$ext" "$out/bench_tpu101/${stem}_quick.$ext"; done
step profile "$py" -m jaxmnist profile --preset cnn --out "$raw/profile-cnn"
keep "$raw/profile-cnn/profile.json" "$out/profile_cnn/$stem.json"
step profile "$py" -m jaxmnist profile --preset record --out "$raw/profile-record"
keep "$raw/profile-record/profile.json" "$out/profile_record/$stem.json"
# The record presets as a user runs them, from an empty compilation cache (a cache of its
# own, which no earlier step filled); about seven minutes on a TPU v5e chip.
XDG_CACHE_HOME="$raw/record-cache" STEP_LIMIT=${RECORD_LIMIT:-900} step record \
  "$py" -c "$launch" benchmarks/record.py --out "$out/record/$stem.json"
echo "== done: $out/*/$stem.*" | tee -a "$log"
