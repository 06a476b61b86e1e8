#!/bin/sh
# Data-parallel benchmark on this machine's 2 cores, one BLAS thread per rank:
#   - LeNet-5, batch 64 per rank: traind with 2 ranks, traind with 1, PyTorch DDP (gloo) with 2,
#     and two independent 1-rank runs at once: what this machine gives two busy cores, the
#     ceiling for 2 ranks (on the CI VM both cores busy run ~10% slower each than one alone);
#   - a 100 MB all-reduce between 2 ranks.
#   bench/ddp.sh [BUILD_DIR]
# Each img/s is the best of ROUNDS (default 5) runs, the contenders interleaved round by round:
# on a shared 2-core VM other tenants only ever slow a run down, and a data-parallel step waits
# for its slowest rank, so single runs scatter by +-20%. The medians are printed too.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
py=/usr/bin/python3
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/lenet.json" <<JSON
{"name": "bench-ddp", "model": {"preset": "lenet5", "num_classes": 10},
 "data": {"format": "synthetic", "shape": [1, 28, 28], "num_classes": 10, "size": 60000},
 "train": {"epochs": 1, "max_steps": 800, "batch_size": 64, "seed": 1, "threads": 1,
           "optimizer": {"type": "sgd", "lr": 0.01, "momentum": 0.9}},
 "log": {"every_steps": 50}}
JSON
rate() { $py -c '
import json, sys
r = [json.loads(l)["samples_per_s"] for l in sys.stdin if "\"event\":\"train\"" in l]
print(sum(r[1:]) / len(r[1:]))'; }
best() { $py -c "import sys; print(max(float(x) for x in sys.argv[1:]))" "$@"; }
median() { $py -c "import sys, statistics; print(statistics.median(float(x) for x in sys.argv[1:]))" "$@"; }
ones="" twos="" torches="" pairs=""
i=0
while [ "$i" -lt "${ROUNDS:-5}" ]; do
    ones="$ones $("$build/traind-worker" "$tmp/lenet.json" 2>/dev/null | rate)"
    "$build/traind-worker" "$tmp/lenet.json" 2>/dev/null | rate >"$tmp/pair" &
    other=$("$build/traind-worker" "$tmp/lenet.json" 2>/dev/null | rate)
    wait
    pairs="$pairs $($py -c "print($other + $(cat "$tmp/pair"))")"
    twos="$twos $("$build/traind-run" --nproc-per-node 2 -- "$build/traind-worker" "$tmp/lenet.json" 2>/dev/null | rate)"
    torches="$torches $(cd "$here" && "$build/traind-run" --nproc-per-node 2 -- $py torch_ddp_peer.py 2>/dev/null |
        $py -c 'import json, sys; print(json.loads(sys.stdin.readline())["img_per_s"])')"
    i=$((i + 1))
done
one=$(best $ones) two=$(best $twos) torch=$(best $torches) pair=$(best $pairs)
mone=$(median $ones) mtwo=$(median $twos) mtorch=$(median $torches) mpair=$(median $pairs)
ar=$("$build/traind-run" --nproc-per-node 2 -- "$build/traind-bench-allreduce" 100 5)
$py -c "
print('LeNet-5, batch 64 per rank, 1 BLAS thread per rank (img/s, all ranks together)')
print(f'|        | traind 1 rank | 2 x 1 rank at once | traind 2 ranks | scaling (2 ranks / 2x1) | 2 ranks / 2 at once | PyTorch DDP gloo 2 ranks | traind / PyTorch |')
for what, one, pair, two, torch in (('best', $one, $pair, $two, $torch), ('median', $mone, $mpair, $mtwo, $mtorch)):
    print(f'| {what:6} | {one:13.0f} | {pair:18.0f} | {two:14.0f} | {two / (2 * one):23.2f} | {two / pair:19.2f} | {torch:24.0f} | {two / torch:15.2f}x |')
"
echo "100 MB all-reduce, 2 ranks: $ar"
