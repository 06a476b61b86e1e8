#!/bin/sh
# GPU benchmark: traind-worker against PyTorch on the same GPU, models, batch sizes, precisions
# and optimizer (SGD, momentum 0.9), on synthetic data of the same shapes, at batch 256:
#   ResNet-50 (3x224x224, 1000 classes, bf16), ResNet-18 with the CIFAR stem (3x32x32, 10
#   classes, bf16), LeNet-5 (1x28x28, fp32 and bf16), MLP 784-1024-1024-10 (fp32);
# PyTorch eager (bf16: torch.autocast + channels_last; fp32: TF32 off, as traind's fp32) and
# with torch.compile; both search cuDNN's algorithms first with the same freedom (PyTorch's
# cudnn.benchmark with its default cudnn.deterministic = False; traind's train.cudnn_benchmark
# with train.deterministic false); then what DDP over a world of one (NCCL, bucketed
# all-reduce) costs on the ResNet-18 for both (traind through TRAIND_FORCE_DDP=1); and GPT-2
# 124M's training tokens/s in bf16 against PyTorch with scaled_dot_product_attention.
#
#   bench/gpu.sh [BUILD_DIR]        (default: build)
#
# Prints training img/s as markdown tables with the ratios. traind's figure is its steady state
# (the train lines after the first, which holds cuDNN planning and the CUDA graph capture) and
# includes its data loader: synthetic samples made on a CPU thread and copied in every step.
# PyTorch's reuses four batches already on the GPU, so any loader cost counts against traind.
# A progress line per figure goes to stderr as it is measured, so a run cut short still shows
# what it had.
# Environment: PYTHON (default python3, with torch and torchvision), BENCH_COMPILE=0 skips
# torch.compile, BENCH_MODELS (comma list of resnet50, resnet18_cifar, lenet5, mlp, ddp, gpt2;
# default all) picks rows, BENCH_TIMEOUT (default 300) bounds each traind-worker and PyTorch process in
# seconds (a hung one reads "failed"), TRAIND_LD_LIBRARY_PATH (for traind-worker alone;
# tests/gpu/run.sh sets it).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
worker=$build/traind-worker
[ -x "$worker" ] || { echo "bench: $worker not found; build first" >&2; exit 1; }
py=${PYTHON:-python3}
compile=${BENCH_COMPILE:-1}
models=${BENCH_MODELS:-resnet50,resnet18_cifar,lenet5,mlp,ddp,gpt2}
limit=${BENCH_TIMEOUT:-300}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

spec() { # model_json shape classes precision steps log_every
    cat <<JSON
{"name": "bench-gpu", "model": $1,
 "data": {"format": "synthetic", "shape": $2, "num_classes": $3, "size": $((256 * $5))},
 "train": {"epochs": 1, "max_steps": $5, "batch_size": 256, "seed": 1, "device": "cuda",
           "precision": "$4", "cudnn_benchmark": true, "deterministic": false,
           "optimizer": {"type": "sgd", "lr": 0.01, "momentum": 0.9}},
 "distributed": {"backend": "nccl"},
 "log": {"every_steps": $6}}
JSON
}

# img/s from the step times of the train lines after the first; "nan" when the run failed
rate() {
    $py -c '
import json, sys
ms = []
for l in sys.stdin:
    if "\"event\":\"train\"" in l:
        try:
            ms.append(float(json.loads(l)["step_ms"]))
        except (ValueError, KeyError):
            pass
mean = sum(ms[1:]) / len(ms[1:]) if len(ms) > 1 else 0
print(256 * 1000.0 / mean if mean > 0 else "nan")' || echo nan
}

ours() { # model_json shape classes precision steps log_every [ddp]
    spec "$1" "$2" "$3" "$4" "$5" "$6" >"$tmp/job.json"
    (
        if [ -n "${TRAIND_LD_LIBRARY_PATH:-}" ]; then
            LD_LIBRARY_PATH=$TRAIND_LD_LIBRARY_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
            export LD_LIBRARY_PATH
        fi
        if [ "${7:-}" = ddp ]; then
            RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 TRAIND_FORCE_DDP=1
            export RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE TRAIND_FORCE_DDP
        fi
        timeout -k 5 "$limit" "$worker" "$tmp/job.json" 2>"$tmp/worker.err" || true
    ) | rate >"$tmp/rate"
    if [ "$(cat "$tmp/rate")" = nan ]; then
        echo "bench: traind-worker: $(tail -1 "$tmp/worker.err")" >&2
    fi
    cat "$tmp/rate"
}

theirs() { # model precision mode steps [--ddp]
    # shellcheck disable=SC2086 # PYTHON may carry options, as elsewhere here
    timeout -k 5 "$limit" $py "$here/torch_gpu_peer.py" --model "$1" --batch 256 \
        --precision "$2" --mode "$3" --steps "$4" --warmup 10 ${5:+"$5"} 2>"$tmp/torch.err" |
        $py -c '
import json, sys
rates = [json.loads(l)["img_per_s"] for l in sys.stdin if l.startswith("{") and "img_per_s" in l]
print(rates[-1])' 2>/dev/null ||
        { echo "bench: torch_gpu_peer.py $*: $(tail -1 "$tmp/torch.err")" >&2; echo nan; }
}
want() { case ",$models," in *",$1,"*) return 0 ;; esac; return 1; }

results=$tmp/results
: >"$results"
row() { # label precision model_json shape classes steps log_every torch_model torch_steps
    want "$8" || return 0
    a=$(ours "$3" "$4" "$5" "$2" "$6" "$7")
    echo "bench: $1 $2: traind $a img/s" >&2
    b=$(theirs "$8" "$2" eager "$9")
    echo "bench: $1 $2: PyTorch eager $b img/s" >&2
    c=skipped
    if [ "$compile" != 0 ]; then
        c=$(theirs "$8" "$2" compile "$9")
        echo "bench: $1 $2: PyTorch compile $c img/s" >&2
    fi
    echo "$1|$2|$a|$b|$c" >>"$results"
}

mnist='[1, 28, 28]'
cifar='[3, 32, 32]'
imagenet='[3, 224, 224]'
r18='{"preset": "resnet18", "num_classes": 10, "stem": "cifar"}'
row "ResNet-50, b256" bf16 '{"preset": "resnet50", "num_classes": 1000}' "$imagenet" 1000 60 10 \
    resnet50 50
row "ResNet-18-cifar, b256" bf16 "$r18" "$cifar" 10 200 20 resnet18_cifar 150
row "LeNet-5, b256" fp32 '{"preset": "lenet5", "num_classes": 10}' "$mnist" 10 400 40 lenet5 300
row "LeNet-5, b256" bf16 '{"preset": "lenet5", "num_classes": 10}' "$mnist" 10 400 40 lenet5 300
row "MLP 784-1024-1024-10, b256" fp32 \
    '{"preset": "mlp", "hidden": [1024, 1024], "num_classes": 10}' "$mnist" 10 400 40 mlp 300

# DDP over a world of one: the same ResNet-18 job, plain and through NCCL's buckets
plain=skipped ddp=skipped tplain=skipped tddp=skipped
if want ddp; then
    plain=$(ours "$r18" "$cifar" 10 bf16 200 20)
    ddp=$(ours "$r18" "$cifar" 10 bf16 200 20 ddp)
    echo "bench: ResNet-18-cifar bf16: traind plain $plain, DDP $ddp img/s" >&2
    tplain=$(theirs resnet18_cifar bf16 eager 150)
    tddp=$(theirs resnet18_cifar bf16 eager 150 --ddp)
    echo "bench: ResNet-18-cifar bf16: PyTorch plain $tplain, DDP $tddp img/s" >&2
fi

# GPT-2 124M (context 1024, batch 16, AdamW, clip 1.0) in bf16: tokens/s, traind on random token
# ids read from a .bin file, PyTorch on random ids already on the GPU, with SDPA (flash attention)
gpt_ours=skipped gpt_eager=skipped gpt_compile=skipped
if want gpt2; then
    $py -c 'import sys, random; random.seed(1)
open(sys.argv[1], "wb").write(bytes(b for _ in range(400000)
    for b in random.randrange(50257).to_bytes(2, "little")))' "$tmp/ids.bin"
    cat >"$tmp/gpt.json" <<JSON
{"name": "bench-gpt2", "model": {"preset": "gpt2"},
 "data": {"format": "tokens", "train": {"path": "$tmp/ids.bin"}, "vocab_size": 50257,
          "block_size": 1024, "val_fraction": 0},
 "train": {"max_steps": 30, "batch_size": 16, "seed": 1, "device": "cuda", "precision": "bf16",
           "optimizer": {"type": "adamw", "lr": 6e-4, "betas": [0.9, 0.95], "weight_decay": 0.1,
                         "decay": "matrices"}, "clip_grad_norm": 1.0},
 "log": {"every_steps": 5}}
JSON
    gpt_ours=$(
        if [ -n "${TRAIND_LD_LIBRARY_PATH:-}" ]; then
            LD_LIBRARY_PATH=$TRAIND_LD_LIBRARY_PATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
            export LD_LIBRARY_PATH
        fi
        timeout -k 5 "$limit" "$worker" "$tmp/gpt.json" 2>"$tmp/gpt.err" | $py -c '
import json, sys
ms = [json.loads(l)["step_ms"] for l in sys.stdin if "\"event\":\"train\"" in l]
print(16 * 1024 * 1000.0 / (sum(ms[1:]) / len(ms[1:])) if len(ms) > 1 else "nan")' || echo nan)
    echo "bench: GPT-2 124M bf16: traind $gpt_ours tok/s ($(tail -1 "$tmp/gpt.err"))" >&2
    for mode in eager compile; do
        [ "$mode" = compile ] && [ "$compile" = 0 ] && continue
        r=$(timeout -k 5 "$limit" $py "$here/torch_gpu_peer.py" --model gpt2 --batch 16 \
            --precision bf16 --mode $mode --steps 20 --warmup 5 2>"$tmp/torch.err" | $py -c '
import json, sys
print([json.loads(l)["tok_per_s"] for l in sys.stdin if l.startswith("{")][-1])' 2>/dev/null ||
            echo nan)
        echo "bench: GPT-2 124M bf16: PyTorch $mode $r tok/s" >&2
        if [ "$mode" = eager ]; then gpt_eager=$r; else gpt_compile=$r; fi
    done
fi

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
torch_version=$($py -c 'import torch; print(torch.__version__)' 2>/dev/null || echo "not found")
$py - "$results" "$plain" "$ddp" "$tplain" "$tddp" "${gpu:-the GPU}" "$torch_version" \
    "$gpt_ours" "$gpt_eager" "$gpt_compile" <<'PY'
import math, sys
results, plain, ddp, tplain, tddp, gpu, torch_version, gpt_ours, gpt_eager, gpt_compile = sys.argv[1:]
def f(x):  # "skipped" (BENCH_COMPILE=0) reads as a missing figure
    try:
        return float(x)
    except ValueError:
        return math.inf
def num(x, width):
    word = "failed" if math.isnan(x) else "skipped" if math.isinf(x) else None
    return f"{word:>{width}}" if word else f"{x:>{width}.0f}"
def ratio(a, b):
    ok = math.isfinite(a) and math.isfinite(b) and b > 0
    return f"{a / b:>5.2f}x" if ok else f"{'-':>6}"
print(f"traind-worker vs PyTorch {torch_version} on {gpu}: training img/s, synthetic data, SGD "
      "momentum 0.9")
print()
print("| model                      | prec | traind img/s | PyTorch eager |  ratio | "
      "PyTorch compile |  ratio |")
print("|----------------------------|------|--------------|---------------|--------|"
      "-----------------|--------|")
for line in open(results):
    label, prec, a, b, c = line.rstrip("\n").split("|")
    a, b, c = f(a), f(b), f(c)
    print(f"| {label:<26} | {prec:<4} | {num(a, 12)} | {num(b, 13)} | {ratio(a, b)} | "
          f"{num(c, 15)} | {ratio(a, c)} |")
print()
print("DDP over a world of one (NCCL), ResNet-18-cifar, b256, bf16")
print()
print("|                   | plain img/s | DDP img/s | DDP cost |")
print("|-------------------|-------------|-----------|----------|")
for who, p, d in (("traind", f(plain), f(ddp)), ("PyTorch eager AMP", f(tplain), f(tddp))):
    ok = math.isfinite(p) and math.isfinite(d) and p > 0
    cost = f"{(1 - d / p) * 100:.1f}%" if ok else "-"
    print(f"| {who:<17} | {num(p, 11)} | {num(d, 9)} | {cost:>8} |")
print()
print("GPT-2 124M, context 1024, batch 16, bf16, AdamW: training tokens/s (PyTorch with SDPA)")
print()
print("| traind tok/s | PyTorch eager |  ratio | PyTorch compile |  ratio |")
print("|--------------|---------------|--------|-----------------|--------|")
a, b, c = f(gpt_ours), f(gpt_eager), f(gpt_compile)
print(f"| {num(a, 12)} | {num(b, 13)} | {ratio(a, b)} | {num(c, 15)} | {ratio(a, c)} |")
PY
