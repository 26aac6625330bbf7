#!/usr/bin/env bash
# Long run of the state machine fuzzer (tests/fuzz_state_worker.py; tests/test_fuzz.py runs a
# short one in the default suite). Seeds are run one after the other, each in its own
# interpreter, until CALLS pyggml calls were made; prints per seed and in total: calls made,
# deaths (the interpreter killed by a GGML_ASSERT abort or a crash), hangs (past the per-seed
# timeout), lost exceptions (FAILURE MISPLACED_EXCEPTION: a callback's exception not raised by
# the call that ran it, or sent to sys.unraisablehook) and the other failures by kind
# (WRONG_RESULT, NOT_REFUSED, UNEXPECTED_EXCEPTION, MODEL). The log of each failing seed is kept.
#
#   scripts/fuzz.sh [CALLS (100000)] [FIRST_SEED (1)]
#   env: EXAMPLES (per seed, 40), STEPS (per example, 50), SEED_TIMEOUT (s, 900),
#        LOGS (folder for failing seeds' logs, default a new mktemp -d), PYTHON (python),
#        SHRINK=1 to shrink failures (slower, shorter reproductions)
# Exit status: 0 when no seed failed. Not part of CI (minutes to hours); run it niced on shared
# machines: nice -n 10 scripts/fuzz.sh 20000
set -u
cd "$(dirname "$0")/.."
CALLS=${1:-100000}
SEED=${2:-1}
EXAMPLES=${EXAMPLES:-40}
STEPS=${STEPS:-50}
SEED_TIMEOUT=${SEED_TIMEOUT:-900}
PYTHON=${PYTHON:-python}
LOGS=${LOGS:-$(mktemp -d -t pyggml-fuzz.XXXXXX)}
mkdir -p "$LOGS"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" GGML_NO_BACKTRACE=1
[ "${SHRINK:-0}" = 1 ] || export FUZZ_NO_SHRINK=1

total=0 seeds=0 deaths=0 hangs=0 lost=0 failed=0
declare -A kinds=()
start=$(date +%s)
while [ "$total" -lt "$CALLS" ]; do
    log="$LOGS/seed-$SEED.log"
    timeout "$SEED_TIMEOUT" "$PYTHON" tests/fuzz_state_worker.py "$SEED" "$EXAMPLES" "$STEPS" >"$log" 2>&1
    rc=$?
    n=$(grep -oE '^calls=[0-9]+' "$log" | tail -1 | cut -d= -f2)
    if [ -z "$n" ]; then  # killed before its summary: count the calls from the step lines
        n=$(grep -cE '^[a-z_]+\(' "$log")
    fi
    total=$((total + n)); seeds=$((seeds + 1))
    what="ok"
    if [ "$rc" -eq 124 ]; then
        hangs=$((hangs + 1)); what="HANG (over ${SEED_TIMEOUT}s)"
    elif [ "$rc" -ge 128 ] || [ "$rc" -eq 134 ]; then
        deaths=$((deaths + 1))
        what="DEATH (exit $rc) after step: $(grep -E '^[a-z_]+\(' "$log" | tail -1); $(grep -m1 -E 'GGML_ASSERT|Segmentation|Fatal Python' "$log")"
    elif [ "$rc" -ne 0 ]; then
        line=$(grep -E '^FAILURE ' "$log" | tail -1)
        kind=$(echo "$line" | sed -E 's/^FAILURE ([A-Z_]+).*/\1/')
        [ -n "$kind" ] || kind=UNKNOWN
        kinds[$kind]=$(( ${kinds[$kind]:-0} + 1 ))
        [ "$kind" = MISPLACED_EXCEPTION ] && lost=$((lost + 1))
        failed=$((failed + 1)); what="${line:-FAILURE (exit $rc)}"
    fi
    [ "$what" = ok ] && rm -f "$log"
    printf 'seed %d: %d calls, %s\n' "$SEED" "$n" "$what"
    SEED=$((SEED + 1))
done
other=""
for k in "${!kinds[@]}"; do [ "$k" = MISPLACED_EXCEPTION ] || other+=" $k=${kinds[$k]}"; done
echo "----"
echo "seeds=$seeds calls=$total deaths=$deaths hangs=$hangs lost_exceptions=$lost other_failures=$((failed - lost))${other:+ (${other# })} time=$(( $(date +%s) - start ))s"
echo "logs of failing seeds: $LOGS"
[ $((deaths + hangs + failed)) -eq 0 ]
