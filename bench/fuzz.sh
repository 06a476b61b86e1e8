#!/bin/sh
# Runs the libFuzzer harnesses (tests/fuzz/fuzz_<harness>.c) for SECONDS each and prints, per
# harness, the executions, executions per second, new corpus units and crashes.
#
#   bench/fuzz.sh [SECONDS] [HARNESS...]     (default: 600 seconds, every harness)
#   FUZZ_JOBS=2 bench/fuzz.sh 20             (two harnesses at a time, as CI runs them)
#
# Builds build-fuzz first (CC=clang, -DTRAIND_FUZZ=ON) when it is not there. Each harness runs in
# one process (no -fork), from its seeds (tests/fuzz/corpus/<harness>, read only) and what earlier
# runs found (build-fuzz/fuzz-work/<harness>/corpus, where new units go), with its dictionary. A
# crash, leak, sanitizer report, timeout (-timeout=10) or allocation over 2 GB ends that harness's
# run; its input is kept in build-fuzz/fuzz-work/<harness>/crashes/ and named in the table, and
# the script exits 1. The issue's target is 1,000,000 executions per harness: the default 600 s
# reaches it for every harness on this 2-core VM. The slowest is the cluster's, whose inputs grow
# into conversations of dozens of messages (about 2,000 a second once its corpus has grown; the
# IDX loader about 3,000 to 7,000, the rest 6,000 to 300,000). Long runs can be split into
# pieces: the work corpus carries over from one run to the next.
# shellcheck disable=SC2012 # ls over crash files: libFuzzer names them by hex digests
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-600}
[ $# -gt 0 ] && shift
# every harness, as tests/fuzz/CMakeLists.txt lists them (set(TRAIND_FUZZERS ...))
all=$(sed -n '/^set(TRAIND_FUZZERS/,/)/p' "$root/tests/fuzz/CMakeLists.txt" |
    sed 's/set(TRAIND_FUZZERS//; s/)//')
harnesses=${*:-$all}
jobs=${FUZZ_JOBS:-1}
build=$root/build-fuzz
work=$build/fuzz-work

if [ ! -f "$build/CMakeCache.txt" ]; then
    CC=clang cmake -S "$root" -B "$build" -DTRAIND_FUZZ=ON -DTRAIND_CUDA=OFF \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$build" -j"${TRAIND_BUILD_JOBS:-2}" --target fuzzers >/dev/null

# one harness: its log in work/<harness>/last.log, its figures in work/<harness>/last.stats
run_one() {
    h=$1
    dir=$work/$h
    mkdir -p "$dir/corpus" "$dir/crashes"
    # the harness's scratch files (some write one per input) on tmpfs when there is one: on
    # ext4 each close of a rewritten file starts a writeback, which halved their speed
    tmp=$(mktemp -d /dev/shm/traind-fuzz-"$h".XXXXXX 2>/dev/null) || tmp=$(mktemp -d "$dir/tmp.XXXXXX")
    dict=""
    [ -f "$root/tests/fuzz/$h.dict" ] && dict="-dict=$root/tests/fuzz/$h.dict"
    before=$(ls "$dir/crashes" | wc -l)
    rc=0
    # shellcheck disable=SC2086 # $dict is one word or none
    TMPDIR=$tmp ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
        "$build/fuzz_$h" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$dir/crashes/" $dict \
        "$dir/corpus" "$root/tests/fuzz/corpus/$h" >"$dir/last.log" 2>&1 || rc=$?
    rm -rf "$tmp" # whatever happened to the harness
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/last.log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$dir/last.log" | tail -1)
    units=$(sed -n 's/^stat::new_units_added: *//p' "$dir/last.log" | tail -1)
    crashes=$(($(ls "$dir/crashes" | wc -l) - before))
    newest=""
    [ "$crashes" -gt 0 ] && newest=$(ls -t "$dir/crashes" | head -1)
    # a harness that died before its stats (a crash) still gets a row
    echo "$h ${execs:-?} ${rate:-?} ${units:-?} $crashes $rc ${newest:+$dir/crashes/$newest}" \
        >"$dir/last.stats"
}

running=0
for h in $harnesses; do
    [ -x "$build/fuzz_$h" ] || { echo "bench: no harness fuzz_$h" >&2; exit 2; }
    run_one "$h" &
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then
        wait
        running=0
    fi
done
wait

status=0
printf '%-17s %11s %7s %9s %7s  %s\n' harness executions exec/s new_units crashes "(${seconds} s each)"
for h in $harnesses; do
    # fields: harness, executions, exec/s, new units, crashes, exit status, newest crash input
    # shellcheck disable=SC2046 # the stats line's fields
    set -- $(cat "$work/$h/last.stats")
    printf '%-17s %11s %7s %9s %7s  %s\n' "$1" "$2" "$3" "$4" "$5" "${7:-}"
    if [ "$5" != 0 ] || [ "$6" != 0 ]; then
        status=1
        [ "$5" = 0 ] && echo "bench: fuzz_$1 exited with status $6: see $work/$1/last.log" >&2
    fi
done
[ "$status" = 0 ] || echo "bench: findings above; each harness's log is $work/HARNESS/last.log" >&2
exit "$status"
