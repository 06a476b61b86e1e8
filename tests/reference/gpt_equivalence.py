"""traind's GPT training against PyTorch, step by step.

For a GPT with biases and one without (nanoGPT's recipe has none), PyTorch initialises the
reference model (gpt_reference.py, GPT-2's initialisation) and writes its state_dict as
safetensors; traind-worker starts from it (model.init_from, strict) and trains 50 steps of the
nanoGPT recipe's optimizer (AdamW with decay on the >= 2-D weights only, warmup then cosine to
min_lr, gradient-norm clipping at 1.0) on Shakespeare's text with the char tokenizer, in the
sampler's order without shuffling (step k's batch is windows kB .. kB + B - 1), and the
reference trains on the same batches. It checks:
  - every step's loss within 1e-4 relative, and the learning rate of every step;
  - traind's last checkpoint loads into the reference with strict=True, and its loss over the
    validation split (the text's last 10%, windows of block_size side by side) is traind's;
  - a run stopped after step 20 and resumed ends with the same bytes as the run straight through;
  - two data-parallel ranks of batch B/2 (traind-run --nproc-per-node 2) train as one process
    of batch B: the sampler gives rank r windows kB + r, kB + r + 2, ..., the two halves of
    step k's batch, and DDP averages the halves' gradients, so every step's loss is again
    PyTorch's within 1e-4, and the final weights are the one process's within 1e-5.

usage: /usr/bin/python3 gpt_equivalence.py TRAIND_WORKER TEXT OUTDIR [TRAIND_RUN]
"""
import json
import math
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F

from gpt_reference import GPT

STEPS, BATCH, BLOCK = 50, 8, 16
LR, MIN_LR, WARMUP, DECAY, BETAS, CLIP = 1e-3, 1e-4, 10, 0.1, (0.9, 0.95), 1.0
SIZES = dict(n_layer=2, n_head=2, n_embd=32)
failures = []


def check(ok, message):
    if not ok:
        failures.append(message)
        print("FAIL:", message)


def write_safetensors(path, state):
    header, blobs, offset = {}, [], 0
    for name, t in state.items():
        raw = t.detach().contiguous().float().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hlen])
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", name
        begin, end = info["data_offsets"]
        array = np.frombuffer(raw[8 + hlen + begin:8 + hlen + end], dtype=np.float32)
        tensors[name] = torch.from_numpy(array.copy()).reshape(info["shape"])
    return tensors


def schedule(step, total):
    """traind's cosine schedule (core/td_schedule.c) for 0-based optimizer step `step`."""
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    t, span = min(step - WARMUP, total - WARMUP), max(total - WARMUP, 1)
    return MIN_LR + (LR - MIN_LR) * 0.5 * (1 + math.cos(math.pi * t / span))


def spec(text, init, ckdir, bias, stop_resume=False):
    return {
        "name": "gpt-equivalence",
        "model": dict(preset="gpt", block_size=BLOCK, bias=bias, init_from=init, **SIZES),
        "data": {"format": "text", "train": {"path": text}, "tokenizer": "char",
                 "block_size": BLOCK},
        "train": {"max_steps": STEPS, "batch_size": BATCH, "shuffle": False, "seed": 7,
                  "threads": 1,
                  "optimizer": {"type": "adamw", "lr": LR, "betas": list(BETAS),
                                "weight_decay": DECAY, "decay": "matrices"},
                  "schedule": {"type": "cosine", "warmup_steps": WARMUP, "min_lr": MIN_LR},
                  "clip_grad_norm": CLIP},
        "checkpoint": {"dir": ckdir},
        "log": {"every_steps": 1},
    } | ({"resume_from": "latest"} if stop_resume else {})


def run_worker(worker, out, name, job, *flags):
    path = os.path.join(out, name + ".json")
    with open(path, "w") as f:
        json.dump(job, f)
    done = subprocess.run([worker, *flags, path], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        sys.exit(f"traind-worker {name}: exit {done.returncode}\n{done.stderr}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def windows(ids, offsets):
    x = torch.stack([ids[o:o + BLOCK] for o in offsets])
    y = torch.stack([ids[o + 1:o + BLOCK + 1] for o in offsets])
    return x, y


def reference_losses(model, ids):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": DECAY},
                             {"params": other, "weight_decay": 0.0}], lr=LR, betas=BETAS)
    losses, lrs = [], []
    for step in range(STEPS):
        lr = schedule(step, STEPS)
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = windows(ids, range(step * BATCH, (step + 1) * BATCH))
        loss = F.cross_entropy(model(x).view(-1, model.lm_head.weight.shape[0]), y.view(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        losses.append(loss.item())
        lrs.append(lr)
    return losses, lrs


def val_loss(model, val):
    n = (len(val) - 1 - BLOCK) // BLOCK + 1
    total = 0.0
    with torch.no_grad():
        for start in range(0, n, 256):
            x, y = windows(val, [i * BLOCK for i in range(start, min(n, start + 256))])
            logits = model(x)
            total += F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1),
                                     reduction="sum").item()
    return total / (n * BLOCK)


def compare(bias, worker, text, out, ids, val, vocab):
    tag = "bias" if bias else "no-bias"
    torch.manual_seed(1234)
    model = GPT(vocab=vocab, block_size=BLOCK, bias=bias, **SIZES)
    model.gpt2_init(SIZES["n_layer"])
    init = os.path.join(out, tag + "-init.safetensors")
    write_safetensors(init, model.state_dict())
    ckdir = os.path.join(out, tag + "-ck")
    shutil.rmtree(ckdir, ignore_errors=True)
    lines = run_worker(worker, out, tag, spec(text, init, ckdir, bias))
    trains = [l for l in lines if l["event"] == "train"]
    done = [l for l in lines if l["event"] == "done"][0]
    losses, lrs = reference_losses(model, ids)
    check(len(trains) == STEPS, f"{tag}: {len(trains)} train lines, expected {STEPS}")
    for line, want, lr in zip(trains, losses, lrs):
        step = line["step"]
        rel = abs(line["loss"] - want) / abs(want)
        check(rel <= 1e-4, f"{tag} step {step}: loss {line['loss']:.9g}, PyTorch {want:.9g} "
                           f"(relative {rel:.2g})")
        check(abs(line["lr"] - lr) <= 1e-6 * lr, f"{tag} step {step}: lr {line['lr']}, want {lr}")
    print(f"{tag}: step 1 loss {trains[0]['loss']:.6f} vs {losses[0]:.6f}, step {STEPS} "
          f"{trains[-1]['loss']:.6f} vs {losses[-1]:.6f}")

    final = os.path.join(ckdir, f"step-{STEPS:08d}", "model.safetensors")
    loaded = GPT(vocab=vocab, block_size=BLOCK, bias=bias, **SIZES)
    loaded.load_state_dict(read_safetensors(final), strict=True)
    got = val_loss(loaded, val)
    rel = abs(got - done["val_loss"]) / done["val_loss"]
    check(rel <= 1e-4, f"{tag}: the checkpoint's validation loss in PyTorch {got:.7g}, "
                       f"traind's {done['val_loss']:.7g}")
    ref = val_loss(model, val)
    check(abs(ref - got) / ref <= 1e-3, f"{tag}: PyTorch's own weights give validation loss "
                                        f"{ref:.7g}, traind's checkpoint {got:.7g}")
    print(f"{tag}: validation loss traind {done['val_loss']:.6f}, its checkpoint in PyTorch "
          f"{got:.6f}, PyTorch's run {ref:.6f}")
    return final


def resume_is_exact(worker, text, out, bias, straight):
    ckdir = os.path.join(out, "resume-ck")
    shutil.rmtree(ckdir, ignore_errors=True)
    init = os.path.join(out, "no-bias-init.safetensors")
    run_worker(worker, out, "resume-1", spec(text, init, ckdir, bias), "--stop-after", "20")
    run_worker(worker, out, "resume-2", spec(text, init, ckdir, bias, stop_resume=True))
    step = os.path.join(ckdir, f"step-{STEPS:08d}")
    # the tensors, bit for bit (the weights' metadata holds each run's own spec)
    for name in ("model.safetensors", "optimizer.safetensors"):
        a = read_safetensors(os.path.join(step, name))
        b = read_safetensors(os.path.join(os.path.dirname(straight), name))
        check(a.keys() == b.keys(), f"resume: {name} holds other tensors")
        for key in a:
            check(torch.equal(a[key], b[key]), f"resume: {name} {key} differs from the run "
                                                "straight through")
    with open(os.path.join(step, "state.json")) as a, \
            open(os.path.join(os.path.dirname(straight), "state.json")) as b:
        check(a.read() == b.read(), "resume: state.json differs from the run straight through")


def two_ranks(run, worker, text, out, bias, losses, one_process):
    """The no-bias model on two ranks of BATCH / 2: PyTorch's losses (the one-process batch)
    and the one process's final weights."""
    ckdir = os.path.join(out, "ranks-ck")
    shutil.rmtree(ckdir, ignore_errors=True)
    job = spec(text, os.path.join(out, "no-bias-init.safetensors"), ckdir, bias)
    job["train"]["batch_size"] = BATCH // 2
    path = os.path.join(out, "ranks.json")
    with open(path, "w") as f:
        json.dump(job, f)
    done = subprocess.run([run, "--nproc-per-node", "2", "--", worker, path], capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0:
        sys.exit(f"traind-run, 2 ranks: exit {done.returncode}\n{done.stderr}")
    trains = [json.loads(l) for l in done.stdout.splitlines()
              if l.startswith('{"event":"train"')]
    check(len(trains) == STEPS, f"2 ranks: {len(trains)} train lines, expected {STEPS}")
    worst = 0.0
    for line, want in zip(trains, losses):
        rel = abs(line["loss"] - want) / abs(want)
        worst = max(worst, rel)
        check(rel <= 1e-4, f"2 ranks, step {line['step']}: loss {line['loss']:.9g}, PyTorch "
                           f"{want:.9g} (relative {rel:.2g})")
    a = read_safetensors(os.path.join(ckdir, f"step-{STEPS:08d}", "model.safetensors"))
    b = read_safetensors(one_process)
    diff = max((a[k] - b[k]).abs().max().item() for k in b)
    check(diff <= 1e-5, f"2 ranks: final weights differ from one process's by {diff:.2g}")
    print(f"2 ranks x batch {BATCH // 2}: losses within {worst:.2g} of PyTorch's batch {BATCH}, "
          f"final weights within {diff:.2g} of one process's")


def main():
    worker, text, out = sys.argv[1:4]
    run = sys.argv[4] if len(sys.argv) > 4 else None
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    with open(text, encoding="utf-8") as f:
        chars = f.read()
    vocab = {c: i for i, c in enumerate(sorted(set(chars)))}  # shakespeare_char/prepare.py
    ids = torch.tensor([vocab[c] for c in chars], dtype=torch.long)
    cut = int(len(ids) * (1.0 - 0.1))  # data.val_fraction's default, as td_text.c cuts
    for bias in (True, False):
        final = compare(bias, worker, text, out, ids[:cut], ids[cut:], len(vocab))
    resume_is_exact(worker, text, out, False, final)
    if run:
        torch.manual_seed(1234)
        model = GPT(vocab=len(vocab), block_size=BLOCK, bias=False, **SIZES)
        model.load_state_dict(read_safetensors(os.path.join(out, "no-bias-init.safetensors")))
        losses, _ = reference_losses(model, ids[:cut])
        two_ranks(run, worker, text, out, False, losses, final)
    if failures:
        sys.exit(f"{len(failures)} checks failed")
    print("gpt equivalence: all checks passed")


if __name__ == "__main__":
    main()
