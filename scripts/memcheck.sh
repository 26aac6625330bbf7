#!/usr/bin/env bash
# The state machine fuzzer (tests/fuzz_state_worker.py) under valgrind memcheck: it catches what
# the fuzzer's own checks cannot see, a read of freed memory that still held the right values,
# a write past a tensor's data. Each seed runs in its own valgrind; scripts/memcheck_report.py
# then counts the memory errors whose stack passes through ggml or pyggml (and, apart, the uses
# of uninitialised values: computing on a tensor nothing set, as on numpy.empty, is not one).
#
#   scripts/memcheck.sh [SEEDS (4)] [FIRST_SEED (1)]
#   env: PYTHON: a Python whose installed pyggml is not built for -march=native: valgrind has no
#        AVX-512 (the default in-place build on an AVX-512 machine dies of SIGILL under it).
#        Default build/venv-blas/bin/python (scripts/check_variants.sh blas builds it, CPU
#        x86-64-v3); any variant's venv works. EXAMPLES (per seed, 12), STEPS (per example, 30),
#        LOGS (folder for the logs, default a new mktemp -d); WORKER=threads runs the threads
#        fuzzer (tests/fuzz_threads_worker.py) instead, SEED_SECONDS per seed (60) on 4 threads
# About a minute per seed (valgrind runs ~50x slower). Exit status 0 when valgrind saw no memory
# error through ggml or pyggml and every seed passed. Not part of CI (needs valgrind).
set -u
cd "$(dirname "$0")/.."
SEEDS=${1:-4}
SEED=${2:-1}
PYTHON=${PYTHON:-build/venv-blas/bin/python}
EXAMPLES=${EXAMPLES:-12}
WORKER=${WORKER:-state}
SECONDS_PER_SEED=${SEED_SECONDS:-60}  # (not SECONDS: bash counts the seconds since it started in it)
STEPS=${STEPS:-30}
LOGS=${LOGS:-$(mktemp -d -t pyggml-memcheck.XXXXXX)}
mkdir -p "$LOGS"
LOGS=$(cd "$LOGS" && pwd)
command -v valgrind >/dev/null || { echo "valgrind is not installed (apt install valgrind)"; exit 2; }
case "$PYTHON" in */*) ;; *) PYTHON=$(command -v "$PYTHON") ;; esac
[ -x "$PYTHON" ] || { echo "no $PYTHON: build a variant (scripts/check_variants.sh blas) or set PYTHON"; exit 2; }
PYTHON="$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")"  # absolute, the venv's link kept
# the pyggml of PYTHON, not of this checkout: run from elsewhere, no PYTHONPATH
cpu=$(cd / && env -u PYTHONPATH "$PYTHON" -c 'import json, pyggml; print(json.load(open(pyggml.PACKAGE_DIR / "_build_info.json"))["cpu"])') || exit 2
if [ "$cpu" = native ] && grep -q avx512f /proc/cpuinfo; then
    echo "$PYTHON's pyggml is built for -march=native on an AVX-512 machine: valgrind cannot run it"; exit 2
fi
echo "pyggml of $PYTHON (CPU $cpu), $WORKER fuzzer, seeds $SEED..; logs in $LOGS"
export GGML_NO_BACKTRACE=1 FUZZ_NO_SHRINK=1 PYTHONMALLOC=malloc  # malloc: valgrind sees every free
unset PYTHONPATH
# first, that this pipeline sees a read of freed memory: the raw layer (as C) reads a closed
# context's struct; the report must count it, or a clean run below would prove nothing
(cd / && valgrind --leak-check=no --log-file="$LOGS/valgrind-self-check.log" "$PYTHON" -c '
import gc, numpy as np
from pyggml import Context
from pyggml.raw import lib
ctx = Context(1 << 16)
ctx.from_numpy(np.ones(4, np.float32))
p = ctx.ptr
ctx.close(); del ctx; gc.collect()
lib.ggml_get_first_tensor(p)' >/dev/null 2>&1)
if python scripts/memcheck_report.py "$LOGS/valgrind-self-check.log" >/dev/null; then
    echo "self-check: valgrind did not report a read of freed memory (see $LOGS/valgrind-self-check.log)"; exit 2
fi
echo "self-check: a raw read of freed memory is reported"
failed=0 total=0
for ((s = SEED; s < SEED + SEEDS; s++)); do
    if [ "$WORKER" = threads ]; then
        args=(tests/fuzz_threads_worker.py "$s" "$SECONDS_PER_SEED" 4)
    else
        args=(tests/fuzz_state_worker.py "$s" "$EXAMPLES" "$STEPS")
    fi
    valgrind --leak-check=no --error-limit=no --num-callers=40 --log-file="$LOGS/valgrind-$s.log" \
        "$PYTHON" "${args[@]}" >"$LOGS/seed-$s.log" 2>&1
    rc=$?
    n=$(grep -oE '^calls=[0-9]+' "$LOGS/seed-$s.log" | tail -1 | cut -d= -f2)
    total=$((total + ${n:-0}))
    errs=$(python scripts/memcheck_report.py "$LOGS/valgrind-$s.log" | head -1 | cut -d' ' -f1)
    echo "seed $s: exit $rc, ${n:-?} calls, $errs memory errors through ggml or pyggml"
    [ "$rc" = 0 ] && [ "$errs" = 0 ] || failed=$((failed + 1))
done
echo "----"
echo "seeds=$SEEDS calls=$total failed=$failed (logs: $LOGS)"
python scripts/memcheck_report.py "$LOGS"/valgrind-[0-9]*.log | head -20
[ "$failed" = 0 ]
