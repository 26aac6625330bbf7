#!/usr/bin/env bash
# Long run of the threads fuzzer (tests/fuzz_threads_worker.py; tests/test_threads.py runs a
# short one in the default suite): THREADS threads share a backend, contexts, a graph allocator
# and a graph cache and call them at random (build, place, set, compute, read, reset, close and
# renew). Each seed runs SECONDS in its own interpreter; prints per seed its calls and findings
# (deaths: GGML_ASSERT abort or crash; HANG; WRONG_RESULT; UNEXPECTED_EXCEPTION) and keeps the
# log of each failing seed.
#
#   scripts/fuzz_threads.sh [SEEDS (20)] [FIRST_SEED (1)] [SECONDS (30)] [THREADS (4)]
#   env: LOGS (folder for failing seeds' logs, default a new mktemp -d), PYTHON (python)
# Exit status 0 when no seed failed. Not part of CI; under valgrind: WORKER=threads
# scripts/memcheck.sh.
set -u
cd "$(dirname "$0")/.."
SEEDS=${1:-20}
SEED=${2:-1}
SECONDS_PER_SEED=${3:-30}
THREADS=${4:-4}
PYTHON=${PYTHON:-python}
LOGS=${LOGS:-$(mktemp -d -t pyggml-fuzz-threads.XXXXXX)}
mkdir -p "$LOGS"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" GGML_NO_BACKTRACE=1
total=0 failed=0
for ((s = SEED; s < SEED + SEEDS; s++)); do
    log="$LOGS/seed-$s.log"
    timeout $((SECONDS_PER_SEED + 300)) "$PYTHON" -X faulthandler tests/fuzz_threads_worker.py \
        "$s" "$SECONDS_PER_SEED" "$THREADS" >"$log" 2>&1
    rc=$?
    n=$(grep -oE '^calls=[0-9]+' "$log" | tail -1 | cut -d= -f2)
    total=$((total + ${n:-0}))
    kinds=$(grep -oE '^FAILURE [A-Z_]+' "$log" | sort | uniq -c | awk '{printf "%s %s; ", $1, $3}')
    if [ "$rc" = 0 ]; then
        echo "seed $s: ${n:-?} calls, clean"; rm -f "$log"
    else
        failed=$((failed + 1))
        [ -n "$n" ] || kinds="${kinds}death (exit $rc); "
        echo "seed $s: exit $rc, ${n:-?} calls: ${kinds}log $log"
    fi
done
echo "----"
echo "seeds=$SEEDS calls=$total failed=$failed (logs: $LOGS)"
[ "$failed" = 0 ]
