#!/bin/sh
# Long chaos runs over a cluster of three namespaced nodes (tests/integration/chaos.py): N trials,
# the first with seed S, then S+1, ...; each a storm of random kills, stops, partitions and daemon
# restarts over training jobs, then its invariants (job states as their restart policies dictate,
# metric steps without gap or duplicate, checkpoints that download, match their SHA-256 and load,
# nothing left running, sound databases). Prints each trial's invariants held and failed and a
# summary; a failed trial's whole output stays in the log directory it names. Needs root (the
# namespaces); only addresses inside them are used.
#   bench/chaos.sh [--trials N] [--seed S] [--storm-s SECONDS] [--hung-peer] [BUILD_DIR]
# Defaults: 5 trials from a random seed, a 90 s storm each, the build in ../build.
set -u
here=$(cd "$(dirname "$0")" && pwd)
trials=5 seed="" storm=90 hung="" build=""
while [ $# -gt 0 ]; do
    case $1 in
    --trials) trials=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --storm-s) storm=$2; shift 2 ;;
    --hung-peer) hung=--hung-peer; shift ;;
    -h | --help) sed -n '2,11p' "$0"; exit 0 ;;
    -*) echo "bench/chaos.sh: unknown option $1" >&2; exit 2 ;;
    *) build=$1; shift ;;
    esac
done
build=$(cd "${build:-$here/../build}" && pwd) || exit 2
[ -n "$seed" ] || seed=$(od -An -N3 -tu4 /dev/urandom | tr -d ' ')
logs=$(mktemp -d /tmp/traind-chaos-bench.XXXXXX)
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
echo "chaos: $trials trials from seed $seed, a ${storm} s storm each; logs in $logs"
i=0 passed=0 held_all=0 failed_all=0 jobs_all=0 events_all=0
while [ "$i" -lt "$trials" ]; do
    s=$((seed + i))
    log="$logs/seed-$s.log"
    /usr/bin/python3 "$here/../tests/integration/chaos.py" "$build/traind" "$build/traind-worker" \
        "$here/.." --seed "$s" --storm-s "$storm" $hung >"$log" 2>&1
    rc=$?
    [ "$rc" = 77 ] && { sed -n '/^SKIP/p' "$log"; exit 77; }
    held=$(grep -c '^  held: ' "$log")
    failed=$(grep -c '^FAIL: ' "$log")
    jobs=$(sed -n 's/.*the storm is over: \([0-9]*\) events, \([0-9]*\) jobs.*/\2/p' "$log")
    events=$(sed -n 's/.*the storm is over: \([0-9]*\) events.*/\1/p' "$log")
    took=$(sed -n 's/.*failed (\([0-9]*\) s)$/\1/p' "$log")
    printf 'trial %d seed %d: %s events, %s jobs, %d invariants held, %d failed, %s s%s\n' \
        $((i + 1)) "$s" "${events:-?}" "${jobs:-?}" "$held" "$failed" "${took:-?}" \
        "$([ "$rc" = 0 ] || echo " (exit $rc; see $log)")"
    grep '^FAIL: ' "$log" | cut -c1-400 | sed 's/^/    /'
    [ "$rc" = 0 ] && passed=$((passed + 1)) && rm -f "$log"
    held_all=$((held_all + held)) failed_all=$((failed_all + failed))
    jobs_all=$((jobs_all + ${jobs:-0})) events_all=$((events_all + ${events:-0}))
    i=$((i + 1))
done
echo "chaos summary: $trials trials (seeds $seed..$((seed + trials - 1))), $passed passed;" \
    "$events_all events over $jobs_all jobs; $held_all invariants held, $failed_all failed"
[ "$passed" = "$trials" ] && rmdir "$logs" 2>/dev/null
[ "$passed" = "$trials" ]
