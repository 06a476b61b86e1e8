"""nanoGPT's Shakespeare CPU recipe trained by PyTorch, as nanoGPT's train.py runs it, for the
validation loss examples/shakespeare-gpt.json reaches in traind: 4 layers, 4 heads, 128 wide,
no biases, context 64, batch 12, 2,000 iterations, AdamW (0.9, 0.99), weight decay 0.1 on the
>= 2-D weights, lr 1e-3 with 100 warmup iterations and cosine decay to 1e-4, clip 1.0; batches
at random offsets (get_batch), torch.manual_seed(SEED). Prints the validation loss two ways:
nanoGPT's estimate (the mean of eval_iters = 20 random batches, what its README's 1.88 is) and
over the whole validation text in windows side by side (what traind reports).

usage: OMP_NUM_THREADS=1 /usr/bin/python3 bench/shakespeare_peer.py [SEED]   (about 2.5 min)
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "reference"))
from gpt_reference import GPT  # noqa: E402

ITERS, WARMUP, LR, MIN_LR, B, T = 2000, 100, 1e-3, 1e-4, 12, 64


def get_lr(it):  # nanoGPT's train.py
    if it < WARMUP:
        return LR * (it + 1) / (WARMUP + 1)
    ratio = (it - WARMUP) / (ITERS - WARMUP)
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (LR - MIN_LR)


def main():
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 1337
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    with open(os.path.join(HERE, "..", "examples", "data", "tinyshakespeare.txt")) as f:
        text = f.read()
    vocab = {c: i for i, c in enumerate(sorted(set(text)))}
    data = torch.tensor([vocab[c] for c in text], dtype=torch.long)
    n = int(0.9 * len(data))
    train, val = data[:n], data[n:]

    def get_batch(split):
        d = train if split == "train" else val
        ix = torch.randint(len(d) - T, (B,))
        return (torch.stack([d[i:i + T] for i in ix]), torch.stack([d[i + 1:i + 1 + T] for i in ix]))

    model = GPT(vocab=len(vocab), block_size=T, n_embd=128, n_head=4, n_layer=4, bias=False)
    model.gpt2_init(4)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}], lr=LR, betas=(0.9, 0.99))
    for it in range(ITERS):
        for g in opt.param_groups:
            g["lr"] = get_lr(it)
        x, y = get_batch("train")
        loss = F.cross_entropy(model(x).view(-1, len(vocab)), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    model.eval()
    with torch.no_grad():
        estimate = sum(F.cross_entropy(model(x).view(-1, len(vocab)), y.view(-1)).item()
                       for x, y in (get_batch("val") for _ in range(20))) / 20
        windows = (len(val) - 1 - T) // T + 1
        total = 0.0
        for s in range(0, windows, 256):
            idx = range(s, min(windows, s + 256))
            x = torch.stack([val[i * T:i * T + T] for i in idx])
            y = torch.stack([val[i * T + 1:i * T + T + 1] for i in idx])
            total += F.cross_entropy(model(x).view(-1, len(vocab)), y.view(-1),
                                     reduction="sum").item()
    print(f"seed {seed}: validation loss {total / (windows * T):.4f} over the whole split, "
          f"{estimate:.4f} as nanoGPT estimates it (20 random batches)")


if __name__ == "__main__":
    main()
