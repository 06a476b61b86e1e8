#!/bin/sh
# CPU benchmark: traind-worker against PyTorch (Debian's python3-torch) on the same models,
# batch sizes and optimizer, on synthetic data of the same shape (Fashion-MNIST's, CIFAR's), at
# the same thread count, in one run: LeNet-5, the MLP, and ResNet-18 with the CIFAR stem at 1 and
# 2 threads; traind on every instruction set of its kernels this CPU runs (TRAIND_ISA), so an
# AVX-512 machine also shows the AVX2 path an AMD EPYC would take. On the AVX2 rows PyTorch is
# held to AVX2 as well (OpenBLAS's Haswell kernels, oneDNN's ONEDNN_MAX_CPU_ISA=AVX2, ATen's
# ATEN_CPU_CAPABILITY=avx2), which is what it runs on an AVX2-only CPU: left alone, its oneDNN
# convolutions take AVX-512 on this machine, and the row would compare an AMD EPYC's traind with
# an Intel Xeon's PyTorch.
#
#   bench/cpu.sh [BUILD_DIR]        (default: build, a portable build: no -march=native)
#   ISAS="avx2 avx512" bench/cpu.sh (only those paths)
#   MODELS="mlp" ROUNDS=5 bench/cpu.sh (only those rows: lenet5, mlp, resnet18_cifar)
#
# Prints img/s for both and the ratio. Each figure is the best of ROUNDS (default 3) runs, the
# three contenders interleaved round by round: on a shared 2-core VM other tenants only ever slow
# a run down, so the best run is the least disturbed one, and interleaving gives each contender
# the same chances. PyTorch runs twice: as installed, and with
# OPENBLAS_CORETYPE set to the kernels traind-worker selects, since Debian's OpenBLAS misdetects
# recent Xeons and falls back to generic kernels in every process that does not correct it.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
worker=$build/traind-worker
[ -x "$worker" ] || { echo "bench: $worker not found; build first" >&2; exit 1; }
for m in ${MODELS:-}; do
    case $m in
    lenet5 | mlp | resnet18_cifar) ;;
    *) echo "bench: MODELS: no row \"$m\" (the rows: lenet5 mlp resnet18_cifar)" >&2 && exit 2 ;;
    esac
done
py=/usr/bin/python3
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# the OpenBLAS kernels traind-worker runs with (after correcting a generic fallback)
core=$(cd "$tmp" && "$worker" --blas-core)

spec() { # model_json batch steps threads shape log_every
    cat <<JSON
{"name": "bench", "model": $1,
 "data": {"format": "synthetic", "shape": $5, "num_classes": 10, "size": 60000},
 "train": {"epochs": 1, "max_steps": $3, "batch_size": $2, "seed": 1, "threads": $4,
           "optimizer": {"type": "sgd", "lr": 0.01, "momentum": 0.9}},
 "log": {"every_steps": $6}}
JSON
}

ours() { # isa model_json batch steps threads shape log_every -> img/s after the first interval
    isa=$1
    shift
    spec "$1" "$2" "$3" "$4" "$5" "$6" >"$tmp/job.json"
    # the AVX2 rows also take OpenBLAS's AVX2 kernels, as an AVX2-only CPU (AMD EPYC) would
    blas=""
    if [ "$isa" = avx2 ]; then blas=$avx2_core; fi
    env ${blas:+OPENBLAS_CORETYPE=$blas} TRAIND_ISA="$isa" OPENBLAS_NUM_THREADS="$4" "$worker" "$tmp/job.json" 2>/dev/null | $py -c '
import json, sys
rates = [json.loads(l)["samples_per_s"] for l in sys.stdin if "\"event\":\"train\"" in l]
print(sum(rates[1:]) / len(rates[1:]))'
}

theirs() { # model batch steps threads [coretype [avx2]]
    if [ "${6:-}" = avx2 ]; then
        export ONEDNN_MAX_CPU_ISA=AVX2 DNNL_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2
    else
        unset ONEDNN_MAX_CPU_ISA DNNL_MAX_CPU_ISA ATEN_CPU_CAPABILITY
    fi
    OPENBLAS_CORETYPE=${5:-} OPENBLAS_NUM_THREADS=$4 OMP_NUM_THREADS=$4 \
        $py "$here/torch_peer.py" --model "$1" --batch "$2" --steps "$3" --warmup "$(($3 / 10 + 1))" \
        --threads "$4" | $py -c 'import json, sys; print(json.load(sys.stdin)["img_per_s"])'
}

rounds=${ROUNDS:-3}
best() { $py -c "import sys; print(max(float(x) for x in sys.argv[1:]))" "$@"; }

# the instruction sets to run: every one this CPU runs, or $ISAS
isas=""
for isa in ${ISAS:-baseline avx2 avx512}; do
    if TRAIND_ISA=$isa "$worker" --isa >/dev/null 2>&1; then isas="$isas $isa"; fi
done

# the AVX2 rows' OpenBLAS kernels, when they differ from traind's own choice: any of OpenBLAS's
# AVX-512 kernel sets (SkylakeX on a Xeon, Cooperlake on an AMD Zen 4, SapphireRapids) becomes
# Haswell, the AVX2 set an AVX2-only Xeon or EPYC runs (OpenBLAS's Zen kernels are Haswell's)
avx2_core=""
case " $isas " in *" avx2 "*) case $core in SkylakeX | Cooperlake | SapphireRapids) avx2_core=Haswell ;; esac ;; esac
# whether the AVX2 rows hold PyTorch to AVX2: only where this CPU has more (AVX-512)
cap_avx2=""
case " $isas " in *" avx512 "*) case " $isas " in *" avx2 "*) cap_avx2=yes ;; esac ;; esac

row() { # label model_json torch_model batch steps threads shape log_every torch_steps
    case " ${MODELS:-$3} " in *" $3 "*) ;; *) return 0 ;; esac
    bs="" cs="" hs=""
    for isa in $isas; do eval "as_$isa=''"; done
    i=0
    while [ "$i" -lt "$rounds" ]; do
        for isa in $isas; do
            eval "as_$isa=\"\$as_$isa $(ours "$isa" "$2" "$4" "$5" "$6" "$7" "$8")\""
        done
        bs="$bs $(theirs "$3" "$4" "$9" "$6")"
        if [ -n "$core" ]; then cs="$cs $(theirs "$3" "$4" "$9" "$6" "$core")"; fi
        if [ -n "$cap_avx2" ]; then hs="$hs $(theirs "$3" "$4" "$9" "$6" "${avx2_core:-$core}" avx2)"; fi
        i=$((i + 1))
    done
    b=$(best $bs)
    for isa in $isas; do
        # PyTorch+core: PyTorch on the same OpenBLAS kernels as this row's traind (and on the AVX2
        # row, with oneDNN and ATen held to AVX2 too)
        c=$b
        if [ -n "$core" ]; then c=$(best $cs); fi
        if [ "$isa" = avx2 ] && [ -n "$cap_avx2" ]; then c=$(best $hs); fi
        eval "a=\$(best \$as_$isa)"
        $py -c "
a, b, c = $a, $b, $c
print(f'| {\"$1\":<32} | {\"$isa\":<8} | {a:>10.1f} | {b:>10.1f} | {a / b:>6.2f}x | {c:>12.1f} | {a / c:>6.2f}x |')"
    done
}

echo "traind-worker vs PyTorch $($py -c 'import torch; print(torch.__version__)'), img/s (training), best of $rounds"
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1); traind's kernels by instruction set:$isas (best: $(cd "$tmp" && "$worker" --isa))"
echo "OpenBLAS kernels: traind-worker ${core:-as detected} (avx2 rows: ${avx2_core:-the same}, as on an AVX2-only CPU); PyTorch as installed, then (PyTorch+core) with the row's kernels (avx2 rows: and ONEDNN_MAX_CPU_ISA=AVX2, ATEN_CPU_CAPABILITY=avx2, as on an AVX2-only CPU)"
echo
echo "| model                            | isa      |     traind |    PyTorch |  ratio | PyTorch+core |  ratio |"
echo "|----------------------------------|----------|------------|------------|--------|--------------|--------|"
mnist='[1, 28, 28]'
cifar='[3, 32, 32]'
r18='{"preset": "resnet18", "num_classes": 10, "stem": "cifar"}'
row "LeNet-5, b64, 1 thread" '{"preset": "lenet5", "num_classes": 10}' lenet5 64 600 1 "$mnist" 50 300
row "MLP 784-512-512-10, b128, 1 thr" '{"preset": "mlp", "hidden": [512, 512], "num_classes": 10}' mlp 128 400 1 "$mnist" 50 300
row "ResNet-18-cifar, b64, 1 thr" "$r18" resnet18_cifar 64 5 1 "$cifar" 1 4
row "ResNet-18-cifar, b64, 2 thr" "$r18" resnet18_cifar 64 5 2 "$cifar" 1 4
