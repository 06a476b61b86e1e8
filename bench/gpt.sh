#!/bin/sh
# GPT training speed on the CPU: traind-worker against PyTorch (Debian's python3-torch 1.13), in
# one run, two models:
#   - nanoGPT's Shakespeare recipe (4 layers, 4 heads, 128 wide, context 64, batch 12, AdamW,
#     clip 1.0) at 1 and 2 threads (THREADS), STEPS steps (30);
#   - GPT-2 124M (12 layers, 12 heads, 768 wide, vocabulary 50257, context 1024) at 2 threads,
#     GPT2_STEPS steps (10), batch GPT2_BATCH (2: the largest PyTorch fits in 8 GiB, 7.2 GB peak
#     RSS; 3 needs about 10), on random token ids (a .bin file both read: what the ids say does
#     not change the work). GPT2_STEPS=0 leaves the row out (PyTorch takes a minute a step).
# For each: the median step after warm-up as tokens/s, the ratio, each process's peak RSS, and
# the share of the core's FLOP ceiling each reaches: the model's FLOPs per token as nanoGPT's
# estimate_mfu counts them (6 per parameter, plus 12·L·T·C for attention) against the best sgemm
# rate OpenBLAS reaches here (a 1024² product timed through PyTorch at the same threads: the
# practical ceiling, not a datasheet's). PyTorch runs nanoGPT's architecture as
# tests/reference/torch_parity.py writes it (non-flash attention, what 1.13 has). Each figure is
# the best of ROUNDS (default 3; 1 for GPT-2) runs, the two contenders interleaved (on a shared VM
# other tenants only slow a run down).
#   bench/gpt.sh [BUILD_DIR]        STEPS=30 ROUNDS=3 THREADS="1 2" GPT2_STEPS=10 bench/gpt.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
[ -x "$build/traind-worker" ] || { echo "bench: $build/traind-worker not found; build first" >&2; exit 1; }
exec /usr/bin/python3 - "$build/traind-worker" "$here" "${STEPS:-30}" "${ROUNDS:-3}" "${THREADS:-1 2}" \
    "${GPT2_STEPS:-10}" "${GPT2_BATCH:-2}" <<'PY'
import json, os, resource, subprocess, sys, tempfile
worker, here, steps, rounds, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5].split()
gpt2_steps, gpt2_batch = int(sys.argv[6]), int(sys.argv[7])
text = os.path.join(here, "..", "examples", "data", "tinyshakespeare.txt")
SHAKESPEARE = dict(name="nanoGPT Shakespeare recipe", L=4, H=4, C=128, T=64, B=12, V=65, bias=True,
                   steps=steps)
GPT2 = dict(name="GPT-2 124M", L=12, H=12, C=768, T=1024, B=gpt2_batch, V=50257, bias=True,
            steps=gpt2_steps)

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

def ids_file():
    """300,000 random GPT-2 token ids as nanoGPT's prepare.py writes them (uint16)."""
    import numpy
    f = tempfile.NamedTemporaryFile(suffix=".bin", delete=False)
    numpy.random.default_rng(1).integers(0, GPT2["V"], 300000).astype("<u2").tofile(f)
    f.close()
    return f.name

def traind(m, n):
    T = m["T"]
    if m is GPT2:
        data = {"format": "tokens", "train": {"path": m["ids"]}, "vocab_size": m["V"]}
    else:
        data = {"format": "text", "train": {"path": text}}
    data.update({"block_size": T, "num_workers": 0, "val_fraction": 0})
    spec = {"name": "bench-gpt",
            "model": {"preset": "gpt", "n_layer": m["L"], "n_head": m["H"], "n_embd": m["C"],
                      "block_size": T, "bias": m["bias"]},
            "data": data,
            "train": {"max_steps": m["steps"], "batch_size": m["B"], "seed": 1, "threads": n,
                      "optimizer": {"type": "adamw", "lr": 1e-3, "betas": [0.9, 0.99],
                                    "weight_decay": 0.1, "decay": "matrices"},
                      "clip_grad_norm": 1.0},
            "log": {"every_steps": 5 if m is SHAKESPEARE else 1}}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS=str(n))
    out, rss = measured([worker, f.name], env)
    os.unlink(f.name)
    ms = [json.loads(l)["step_ms"] for l in out.splitlines() if l.startswith('{"event":"train"')]
    warm = sorted(ms[len(ms) // 3:])
    return warm[len(warm) // 2], rss

def torch_run(m, n):
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(n), OMP_NUM_THREADS=str(n))
    data = ["--vocab", str(m["V"])] if m is GPT2 else ["--text", text]
    out, rss = measured([sys.executable, os.path.join(here, "torch_gpt_peer.py")] + data +
                        ["--layers", str(m["L"]), "--heads", str(m["H"]), "--embd", str(m["C"]),
                         "--block", str(m["T"]), "--batch", str(m["B"]), "--bias", str(int(m["bias"])),
                         "--steps", str(m["steps"]), "--threads", str(n)], env)
    line = [l for l in out.splitlines() if l.startswith("{")][0]
    return json.loads(line)["step_ms"], rss

def ceiling_gflops(n):
    code = ("import time,torch;torch.set_num_threads(%d);a=torch.randn(1024,1024);b=torch.randn(1024,1024)\n"
            "best=1e9\nfor _ in range(20):\n t=time.perf_counter();a@b;best=min(best,time.perf_counter()-t)\n"
            "print(2*1024**3/best/1e9)" % n)
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(n), OMP_NUM_THREADS=str(n))
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                env=env, check=True).stdout)

def row(m, n, rounds):
    L, C, V, T, B = m["L"], m["C"], m["V"], m["T"], m["B"]
    per_layer = 12 * C * C + (13 * C if m["bias"] else 4 * C)
    params = V * C + T * C + L * per_layer + (2 * C if m["bias"] else C)
    flops_per_token = 6 * params + 12 * L * T * C
    best = {"traind": (1e9, 0), "torch": (1e9, 0)}
    for _ in range(rounds):
        for name, fn in (("traind", traind), ("torch", torch_run)):
            ms, rss = fn(m, n)
            if ms < best[name][0]:
                best[name] = (ms, rss)
    tt, tp = B * T / (best["traind"][0] / 1000), B * T / (best["torch"][0] / 1000)
    peak = ceiling_gflops(n)
    ft, fp = tt * flops_per_token / 1e9 / peak, tp * flops_per_token / 1e9 / peak
    print(f"{m['name'][:26]:<26} {n:>7} {tt:>13.0f} {tp:>14.0f} {tt / tp:>5.2f}x {best['traind'][1]:>9.0f} MB {best['torch'][1]:>10.0f} MB {peak:>16.1f} {ft:>6.0%} {fp:>7.0%}", flush=True)

for m in (SHAKESPEARE, GPT2):
    L, C, T, B = m["L"], m["C"], m["T"], m["B"]
    print(f"{m['name']}: {L} layers x {m['H']} heads x {C}, context {T}, batch {B}, {m['steps']} steps")
print(f"{'model':<26} {'threads':>7} {'traind tok/s':>13} {'PyTorch tok/s':>14} {'ratio':>6} {'RSS traind':>11} {'RSS PyTorch':>12} {'ceiling GFLOP/s':>16} {'traind':>7} {'PyTorch':>8}")
for n in map(int, threads):
    row(SHAKESPEARE, n, rounds)
if gpt2_steps > 0:
    GPT2["ids"] = ids_file()
    try:
        row(GPT2, 2, 1)
    finally:
        os.unlink(GPT2["ids"])
PY
