"""The PyTorch side of bench/gpt.sh: nanoGPT's GPT (tests/reference/torch_parity.py writes its
architecture: non-flash attention, as PyTorch 1.13 has no scaled_dot_product_attention) trained
with AdamW on random windows of a text's characters (or, with --vocab, of random token ids: GPT-2
124M's row, where what the ids say does not change the work), the batch and sizes of the traind
run.
Prints one JSON line: milliseconds per step (best interval after warm-up) and tokens/s.

Run with /usr/bin/python3 (Debian's python3-torch); threads come from the caller.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "reference"))
import torch_parity  # noqa: E402


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--text")
    a.add_argument("--vocab", type=int, help="random ids below this instead of --text's characters")
    a.add_argument("--bias", type=int, default=1)
    a.add_argument("--layers", type=int, default=4)
    a.add_argument("--heads", type=int, default=4)
    a.add_argument("--embd", type=int, default=128)
    a.add_argument("--block", type=int, default=64)
    a.add_argument("--batch", type=int, default=12)
    a.add_argument("--steps", type=int, default=30)
    a.add_argument("--threads", type=int, default=1)
    o = a.parse_args()
    torch.set_num_threads(o.threads)
    torch.manual_seed(1337)
    if o.vocab:
        vocab = o.vocab
        ids = torch.randint(vocab, (200000,))
    else:
        text = open(o.text, encoding="utf-8").read()
        chars = sorted(set(text))
        vocab = len(chars)
        ids = torch.tensor([chars.index(c) for c in text[:200000]], dtype=torch.long)
    model = torch_parity.TinyGPT(vocab, o.block, o.embd, o.heads, o.layers, bias=bool(o.bias))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    times = []
    for step in range(o.steps):
        ix = torch.randint(len(ids) - o.block - 1, (o.batch,))
        x = torch.stack([ids[i:i + o.block] for i in ix])
        y = torch.stack([ids[i + 1:i + 1 + o.block] for i in ix])
        t0 = time.perf_counter()
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    warm = times[len(times) // 3:]
    ms = 1000 * sorted(warm)[len(warm) // 2]  # the median step after warm-up
    print(json.dumps({"step_ms": ms, "tokens_per_s": o.batch * o.block / (ms / 1000)}))


if __name__ == "__main__":
    main()
