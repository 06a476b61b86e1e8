#!/bin/sh
# Data-parallel benchmark on this machine's 2 cores, one BLAS thread per rank, on every
# instruction set of traind's kernels the CPU runs (TRAIND_ISA; ISAS="avx2" picks):
#   - LeNet-5, batch 64 per rank: traind with 2 ranks, traind with 1, PyTorch DDP (gloo) with 2,
#     and two independent 1-rank runs at once: what this machine gives two busy cores, the
#     ceiling for 2 ranks (on the CI VM both cores busy run ~10% slower each than one alone);
#   - the lockstep ceiling: 2 ranks of fixed arithmetic (no memory traffic) with a one-float
#     all-reduce per step, against 1 (bench/lockstep_main.c), interleaved with the rest: what
#     any synchronous data-parallel step of about the same length can get from this machine,
#     whose cores run at different speeds from moment to moment (each step waits for the
#     slower one);
#   - a 100 MB all-reduce between 2 ranks.
#   bench/ddp.sh [BUILD_DIR]
# Each img/s is the best of ROUNDS (default 5) runs, the contenders interleaved round by round:
# on a shared 2-core VM other tenants only ever slow a run down, and a data-parallel step waits
# for its slowest rank, so single runs scatter by +-20%. The medians are printed too.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
py=/usr/bin/python3
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/lenet.json" <<JSON
{"name": "bench-ddp", "model": {"preset": "lenet5", "num_classes": 10},
 "data": {"format": "synthetic", "shape": [1, 28, 28], "num_classes": 10, "size": 60000},
 "train": {"epochs": 2, "max_steps": 1600, "batch_size": 64, "seed": 1, "threads": 1,
           "optimizer": {"type": "sgd", "lr": 0.01, "momentum": 0.9}},
 "log": {"every_steps": 50}}
JSON
rate() { $py -c '
import json, sys
r = [json.loads(l)["samples_per_s"] for l in sys.stdin if "\"event\":\"train\"" in l]
print(sum(r[1:]) / len(r[1:]))'; }
worker=$build/traind-worker
isas=""
for isa in ${ISAS:-baseline avx2 avx512}; do
    if TRAIND_ISA=$isa "$worker" --isa >/dev/null 2>&1; then isas="$isas $isa"; fi
done
core=$(cd "$tmp" && "$worker" --blas-core)
# as bench/cpu.sh: the avx2 rows take OpenBLAS's AVX2 kernels, as an AVX2-only CPU would
# (any of OpenBLAS's AVX-512 kernel sets: SkylakeX on a Xeon, Cooperlake on an AMD Zen 4)
blas_for() {
    if [ "$1" = avx2 ]; then case $core in SkylakeX | Cooperlake | SapphireRapids) echo Haswell ;; esac; fi
}
run1() { # isa -> img/s of one rank
    b=$(blas_for "$1")
    env ${b:+OPENBLAS_CORETYPE=$b} TRAIND_ISA="$1" "$worker" "$tmp/lenet.json" 2>/dev/null | rate
}
run2() { # isa -> img/s of two ranks
    b=$(blas_for "$1")
    env ${b:+OPENBLAS_CORETYPE=$b} TRAIND_ISA="$1" "$build/traind-run" --nproc-per-node 2 -- \
        "$worker" "$tmp/lenet.json" 2>/dev/null | rate
}
torches="" torches_avx2=""
# on an AVX-512 CPU the avx2 row's PyTorch is held to AVX2 too (bench/cpu.sh says why)
cap_avx2="" avx2_blas=$(blas_for avx2)
case " $isas " in *" avx512 "*) case " $isas " in *" avx2 "*) cap_avx2=yes ;; esac ;; esac
torch_ddp() { # [env assignments...] -> img/s of PyTorch DDP, 2 ranks
    (cd "$here" && env "$@" "$build/traind-run" --nproc-per-node 2 -- $py torch_ddp_peer.py 2>/dev/null |
        $py -c 'import json, sys; print(json.loads(sys.stdin.readline())["img_per_s"])')
}
lockstep() { # ranks -> steps/s of 100 MFLOP steps (about LeNet's step time, b64, one core)
    "$build/traind-run" --nproc-per-node "$1" -- "$build/traind-bench-lockstep" 100 800 2>/dev/null |
        $py -c 'import json, sys; print(json.loads(sys.stdin.readline())["steps_per_s"])'
}
ceilings=""
for isa in $isas; do eval "ones_$isa='' twos_$isa='' pairs_$isa=''"; done
i=0
while [ "$i" -lt "${ROUNDS:-5}" ]; do
    for isa in $isas; do
        one=$(run1 "$isa")
        run1 "$isa" >"$tmp/pair" &
        other=$(run1 "$isa")
        wait
        pair=$($py -c "print($other + $(cat "$tmp/pair"))")
        two=$(run2 "$isa")
        eval "ones_$isa=\"\$ones_$isa $one\" pairs_$isa=\"\$pairs_$isa $pair\" twos_$isa=\"\$twos_$isa $two\""
    done
    lock1=$(lockstep 1)
    lock2=$(lockstep 2)
    ceilings="$ceilings $($py -c "print($lock2 / $lock1)")"
    torches="$torches $(torch_ddp ${core:+OPENBLAS_CORETYPE=$core})"
    if [ -n "$cap_avx2" ]; then
        torches_avx2="$torches_avx2 $(torch_ddp OPENBLAS_CORETYPE="${avx2_blas:-$core}" \
            ONEDNN_MAX_CPU_ISA=AVX2 DNNL_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2)"
    fi
    i=$((i + 1))
done
ar=$("$build/traind-run" --nproc-per-node 2 -- "$build/traind-bench-allreduce" 100 5)
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1); OpenBLAS kernels: ${core:-as detected} (avx2 rows: ${avx2_blas:-the same}); PyTorch with the same kernels${cap_avx2:+, and on the avx2 row with ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2, as on an AVX2-only CPU}"
echo "LeNet-5, batch 64 per rank, 1 BLAS thread per rank (img/s, all ranks together), ${ROUNDS:-5} interleaved rounds"
echo "| isa      |        | traind 1 rank | 2 x 1 rank at once | traind 2 ranks | scaling (2 ranks / 2x1) | 2 ranks / 2 at once | lockstep ceiling | scaling / ceiling | PyTorch DDP gloo 2 ranks | traind / PyTorch |"
for isa in $isas; do
    eval "ones=\$ones_$isa pairs=\$pairs_$isa twos=\$twos_$isa"
    peer=$torches
    if [ "$isa" = avx2 ] && [ -n "$cap_avx2" ]; then peer=$torches_avx2; fi
    $py -c "
import statistics
ones, pairs, twos, torches, ceils = ([float(x) for x in s.split()] for s in ('$ones', '$pairs', '$twos', '$peer', '$ceilings'))
for what, f in (('best', max), ('median', statistics.median)):
    one, pair, two, torch, ceil = f(ones), f(pairs), f(twos), f(torches), f(ceils)
    print(f'| {\"$isa\":8} | {what:6} | {one:13.0f} | {pair:18.0f} | {two:14.0f} | {two / (2 * one):23.2f} | {two / pair:19.2f} | {ceil:16.2f} | {two / (2 * one) / ceil:17.2f} | {torch:24.0f} | {two / torch:15.2f}x |')
"
done
echo "100 MB all-reduce, 2 ranks: $ar"
