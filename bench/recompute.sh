#!/bin/sh
# Activation checkpointing on the CPU: ResNet-18 (CIFAR stem, batch 32, one thread), each of its
# 8 residual blocks a segment, against the same run keeping every activation — and PyTorch doing
# the same with torch.utils.checkpoint around each block. Peak RSS of the whole process and the
# median step time; the ratios (checkpointed / plain) are what compare across the two.
#   bench/recompute.sh [BUILD_DIR]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
py=/usr/bin/python3
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
spec() {
    cat <<JSON
{"name": "bench-recompute",
 "model": {"preset": "resnet18", "stem": "cifar", "num_classes": 10},
 "data": {"format": "synthetic", "shape": [3, 32, 32], "num_classes": 10, "size": 4096},
 "train": {"max_steps": 9, "batch_size": 32, "seed": 1, "threads": 1,
           "optimizer": {"type": "sgd", "lr": 0.1, "momentum": 0.9}$1},
 "log": {"every_steps": 1}}
JSON
}
spec "" >"$tmp/plain.json"
spec ', "activation_checkpointing": ["layer1.0", "layer1.1", "layer2.0", "layer2.1",
      "layer3.0", "layer3.1", "layer4.0", "layer4.1"]' >"$tmp/ckpt.json"
# median step_ms of the train lines after the first, and the peak RSS (MB) from /usr/bin/time
traind() {
    /usr/bin/time -f "%M" -o "$tmp/rss" "$build/traind-worker" "$tmp/$1.json" 2>"$tmp/log" |
        $py -c '
import json, statistics, sys
t = [json.loads(l)["step_ms"] for l in sys.stdin if "\"event\":\"train\"" in l]
print(json.dumps({"step_ms": statistics.median(t[1:]), "peak_mb": int(open(sys.argv[1]).read().split()[-1]) / 1024}))' "$tmp/rss"
}
tp=$(traind plain)
tc=$(traind ckpt)
grep "activation checkpointing" "$tmp/log" | sed 's/^\[traind\] /traind: /'
pp=$(cd "$here" && $py torch_recompute_peer.py)
pc=$(cd "$here" && $py torch_recompute_peer.py --checkpoint)
$py - "$tp" "$tc" "$pp" "$pc" <<'PY'
import json, sys
tp, tc, pp, pc = (json.loads(a) for a in sys.argv[1:])
print("%-28s %12s %12s %12s" % ("ResNet-18 cifar, batch 32", "plain", "checkpointed", "ratio"))
for name, a, b in (("traind", tp, tc), ("PyTorch 1.13", pp, pc)):
    print("%-28s %9.0f ms %9.0f ms %11.2fx" % (name + " step", a["step_ms"], b["step_ms"],
                                               b["step_ms"] / a["step_ms"]))
    print("%-28s %9.0f MB %9.0f MB %11.2fx" % (name + " peak RSS", a["peak_mb"], b["peak_mb"],
                                               b["peak_mb"] / a["peak_mb"]))
print("traind / PyTorch, checkpointed: step %.2fx, peak RSS %.2fx" %
      (tc["step_ms"] / pc["step_ms"], tc["peak_mb"] / pc["peak_mb"]))
PY
