#!/bin/sh
# GPT training speed on the CPU: traind-worker against PyTorch (Debian's python3-torch 1.13) on
# nanoGPT's Shakespeare recipe (4 layers, 4 heads, 128 wide, context 64, batch 12, AdamW, clip
# 1.0) at 1 and 2 threads, in one run: the median step after warm-up as tokens/s, the ratio,
# each process's peak RSS, and the share of the core's FLOP ceiling each reaches: the model's
# FLOPs per token as nanoGPT's estimate_mfu counts them (6 per parameter, plus 12·L·T·C for
# attention) against the best sgemm rate OpenBLAS reaches here (a 1024² product timed through
# PyTorch at the same threads: the practical ceiling, not a datasheet's). PyTorch runs nanoGPT's architecture as tests/reference/
# torch_parity.py writes it (non-flash attention, what 1.13 has). Each figure is the best of
# ROUNDS (default 3) runs, the two contenders interleaved (on a shared VM other tenants only
# slow a run down).
#   bench/gpt.sh [BUILD_DIR]        STEPS=30 ROUNDS=3 THREADS="1 2" bench/gpt.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
[ -x "$build/traind-worker" ] || { echo "bench: $build/traind-worker not found; build first" >&2; exit 1; }
exec /usr/bin/python3 - "$build/traind-worker" "$here" "${STEPS:-30}" "${ROUNDS:-3}" "${THREADS:-1 2}" <<'PY'
import json, os, resource, subprocess, sys, tempfile
worker, here, steps, rounds, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5].split()
text = os.path.join(here, "..", "examples", "data", "tinyshakespeare.txt")
B, T = 12, 64

def measured(cmd, env):
    """(the command's stdout, its peak RSS in MiB): one child at a time, so RUSAGE_CHILDREN's
    maximum grows only when this child's peak is the largest so far; a fresh process per run
    keeps it exact."""
    probe = [sys.executable, "-c",
             "import resource,subprocess,sys;r=subprocess.run(sys.argv[1:],capture_output=True,text=True);"
             "sys.stderr.write(r.stderr);print(r.stdout);"
             "print('RSS',resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"] + cmd
    out = subprocess.run(probe, capture_output=True, text=True, env=env, check=True).stdout
    rss = int(out.strip().splitlines()[-1].split()[1]) / 1024
    return out, rss

def traind(n):
    spec = {"name": "bench-gpt",
            "model": {"preset": "gpt", "n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": T},
            "data": {"format": "text", "train": {"path": text}, "block_size": T, "num_workers": 0,
                     "val_fraction": 0},
            "train": {"max_steps": steps, "batch_size": B, "seed": 1, "threads": n,
                      "optimizer": {"type": "adamw", "lr": 1e-3, "betas": [0.9, 0.99],
                                    "weight_decay": 0.1, "decay": "matrices"},
                      "clip_grad_norm": 1.0},
            "log": {"every_steps": 5}}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS=str(n))
    out, rss = measured([worker, f.name], env)
    os.unlink(f.name)
    ms = [json.loads(l)["step_ms"] for l in out.splitlines() if l.startswith('{"event":"train"')]
    warm = sorted(ms[len(ms) // 3:])
    return warm[len(warm) // 2], rss

def torch_run(n):
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(n), OMP_NUM_THREADS=str(n))
    out, rss = measured([sys.executable, os.path.join(here, "torch_gpt_peer.py"), "--text", text,
                         "--steps", str(steps), "--threads", str(n)], env)
    line = [l for l in out.splitlines() if l.startswith("{")][0]
    return json.loads(line)["step_ms"], rss

def ceiling_gflops(n):
    code = ("import time,torch;torch.set_num_threads(%d);a=torch.randn(1024,1024);b=torch.randn(1024,1024)\n"
            "best=1e9\nfor _ in range(20):\n t=time.perf_counter();a@b;best=min(best,time.perf_counter()-t)\n"
            "print(2*1024**3/best/1e9)" % n)
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(n), OMP_NUM_THREADS=str(n))
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                env=env, check=True).stdout)

L, C, V = 4, 128, 65
params = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C  # with biases, as both run it
flops_per_token = 6 * params + 12 * L * T * C
print(f"nanoGPT Shakespeare recipe (4x4x128, context {T}, batch {B}), {steps} steps, best of {rounds}")
print(f"{flops_per_token / 1e6:.1f} MFLOP per token (nanoGPT's estimate_mfu)")
print(f"{'threads':>7} {'traind tok/s':>13} {'PyTorch tok/s':>14} {'ratio':>6} {'RSS traind':>11} {'RSS PyTorch':>12} {'ceiling GFLOP/s':>16} {'traind':>7} {'PyTorch':>8}")
for n in map(int, threads):
    best = {"traind": (1e9, 0), "torch": (1e9, 0)}
    for _ in range(rounds):
        for name, fn in (("traind", traind), ("torch", torch_run)):
            ms, rss = fn(n)
            if ms < best[name][0]:
                best[name] = (ms, rss)
    tt, tp = B * T / (best["traind"][0] / 1000), B * T / (best["torch"][0] / 1000)
    peak = ceiling_gflops(n)
    ft, fp = tt * flops_per_token / 1e9 / peak, tp * flops_per_token / 1e9 / peak
    print(f"{n:>7} {tt:>13.0f} {tp:>14.0f} {tt / tp:>5.2f}x {best['traind'][1]:>9.0f} MB {best['torch'][1]:>10.0f} MB {peak:>16.1f} {ft:>6.0%} {fp:>7.0%}")
PY
