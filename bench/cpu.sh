#!/bin/sh
# CPU benchmark: traind-worker against PyTorch (Debian's python3-torch) on the same models,
# batch sizes and optimizer, synthetic Fashion-MNIST-shaped data, one thread each, in one run.
#
#   bench/cpu.sh [BUILD_DIR]        (default: build)
#
# Prints img/s for both and the ratio. Each figure is the best of ROUNDS (default 3) runs, the
# three contenders interleaved round by round: on a shared 2-core VM other tenants only ever slow
# a run down, so the best run is the least disturbed one, and interleaving gives each contender
# the same chances. PyTorch runs twice: as installed, and with
# OPENBLAS_CORETYPE set to the kernels traind-worker selects, since Debian's OpenBLAS misdetects
# recent Xeons and falls back to generic kernels in every process that does not correct it.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
worker=$build/traind-worker
[ -x "$worker" ] || { echo "bench: $worker not found; build first" >&2; exit 1; }
py=/usr/bin/python3
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# the OpenBLAS kernels traind-worker runs with (after correcting a generic fallback)
core=$(cd "$tmp" && "$worker" --blas-core)

spec() { # model_json batch steps
    cat <<JSON
{"name": "bench", "model": $1,
 "data": {"format": "synthetic", "shape": [1, 28, 28], "num_classes": 10, "size": 60000},
 "train": {"epochs": 1, "max_steps": $3, "batch_size": $2, "seed": 1, "threads": 1,
           "optimizer": {"type": "sgd", "lr": 0.01, "momentum": 0.9}},
 "log": {"every_steps": 50}}
JSON
}

ours() { # model_json batch steps -> img/s over the steps after the first 50 (warm-up)
    spec "$1" "$2" "$3" >"$tmp/job.json"
    "$worker" "$tmp/job.json" 2>/dev/null | $py -c '
import json, sys
rates = [json.loads(l)["samples_per_s"] for l in sys.stdin if "\"event\":\"train\"" in l]
print(sum(rates[1:]) / len(rates[1:]))'
}

theirs() { # model batch [coretype]
    OPENBLAS_CORETYPE=${3:-} $py "$here/torch_peer.py" --model "$1" --batch "$2" --steps 300 \
        --threads 1 | $py -c 'import json, sys; print(json.load(sys.stdin)["img_per_s"])'
}

rounds=${ROUNDS:-3}
best() { $py -c "import sys; print(max(float(x) for x in sys.argv[1:]))" "$@"; }

row() { # label model_json torch_model batch steps
    as="" bs="" cs=""
    i=0
    while [ "$i" -lt "$rounds" ]; do
        as="$as $(ours "$2" "$4" "$5")"
        bs="$bs $(OPENBLAS_CORETYPE= theirs "$3" "$4")"
        if [ -n "$core" ]; then cs="$cs $(theirs "$3" "$4" "$core")"; fi
        i=$((i + 1))
    done
    a=$(best $as)
    b=$(best $bs)
    c=$b
    if [ -n "$core" ]; then c=$(best $cs); fi
    $py -c "
a, b, c = $a, $b, $c
print(f'| {\"$1\":<22} | {a:>10.0f} | {b:>10.0f} | {a / b:>6.2f}x | {c:>12.0f} | {a / c:>6.2f}x |')"
}

echo "traind-worker vs PyTorch $($py -c 'import torch; print(torch.__version__)'), 1 thread, img/s (training), best of $rounds"
echo "OpenBLAS kernels: traind-worker ${core:-as detected}; PyTorch as installed, then with OPENBLAS_CORETYPE=${core:-unset}"
echo
echo "| model                  |     traind |    PyTorch |  ratio | PyTorch+core |  ratio |"
echo "|------------------------|------------|------------|--------|--------------|--------|"
row "LeNet-5, batch 64" '{"preset": "lenet5", "num_classes": 10}' lenet5 64 600
row "MLP 784-512-512-10, b128" '{"preset": "mlp", "hidden": [512, 512], "num_classes": 10}' mlp 128 400
