"""The PyTorch side of bench/gpu.sh: trains the same model, batch size and optimizer (SGD,
momentum 0.9) as the traind-worker run, on synthetic data of the same shape on the same GPU, and
prints one JSON line with img/s.

  python3 torch_gpu_peer.py --model resnet50 --batch 256 --precision bf16 --mode eager [--ddp]
  python3 torch_gpu_peer.py --model gpt2 --batch 16 --precision bf16 --mode eager   (tokens/s)

bf16 is AMP as PyTorch users run it: torch.autocast(bfloat16) around forward and loss, fp32
weights and optimizer (traind's bf16 keeps fp32 masters too), channels_last for the
convolutional models. fp32 is plain fp32 with TF32 off for convolutions and matmuls, as traind's
fp32. --mode compile wraps the model in torch.compile. --ddp wraps it in DistributedDataParallel
over a world of one (NCCL), for the cost of its bucketed all-reduce. Batches are a few random
tensors made on the GPU once: no data loading is timed.
"""
import argparse
import json
import socket
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# the same models the CPU benchmark trains (this script's directory is on sys.path)
from torch_peer import LeNet5, mlp


def resnet(name):
    import torchvision
    if name == "resnet50":
        return torchvision.models.resnet50(num_classes=1000)
    m = torchvision.models.resnet18(num_classes=10)
    m.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)  # the CIFAR stem: 3x3, stride 1,
    m.maxpool = nn.Identity()                         # no max-pool
    return m


class GPT(nn.Module):
    """nanoGPT's GPT (bias on, the head tied to the token table) with PyTorch's fused
    scaled_dot_product_attention (flash attention where the GPU has it), as nanoGPT runs on
    PyTorch 2."""

    def __init__(self, vocab=50257, block=1024, n_layer=12, n_head=12, n_embd=768):
        super().__init__()
        self.n_head = n_head
        self.wte, self.wpe = nn.Embedding(vocab, n_embd), nn.Embedding(block, n_embd)
        self.h = nn.ModuleList(nn.ModuleDict(dict(
            ln_1=nn.LayerNorm(n_embd), c_attn=nn.Linear(n_embd, 3 * n_embd),
            c_proj=nn.Linear(n_embd, n_embd), ln_2=nn.LayerNorm(n_embd),
            c_fc=nn.Linear(n_embd, 4 * n_embd), mlp_proj=nn.Linear(4 * n_embd, n_embd)))
            for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.wte.weight = self.lm_head.weight

    def forward(self, idx):
        b, t = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for blk in self.h:
            q, k, v = blk["c_attn"](blk["ln_1"](x)).split(x.size(-1), dim=2)
            q, k, v = (z.view(b, t, self.n_head, -1).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + blk["c_proj"](y.transpose(1, 2).contiguous().view(b, t, -1))
            x = x + blk["mlp_proj"](F.gelu(blk["c_fc"](blk["ln_2"](x))))
        return self.lm_head(self.ln_f(x))


def gpt2_main(args):
    """GPT-2 124M, context 1024, AdamW (nanoGPT's settings, fused), random token ids on the GPU:
    prints tokens/s."""
    dev = torch.device("cuda")
    torch.manual_seed(0)
    if args.precision == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = False
    model = GPT().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True)
    run = torch.compile(model) if args.mode == "compile" else model
    pool = [torch.randint(0, 50257, (args.batch, 1025), device=dev) for _ in range(4)]

    def step(i):
        ids = pool[i % len(pool)]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            logits = run(ids[:, :-1])
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), ids[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    for i in range(args.warmup):
        step(i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(args.steps):
        step(i)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print(json.dumps({"impl": "pytorch", "model": "gpt2", "batch": args.batch,
                      "precision": args.precision, "mode": args.mode,
                      "tok_per_s": args.steps * args.batch * 1024 / dt,
                      "torch": torch.__version__, "device": torch.cuda.get_device_name(0)}))


# model: (builder, sample shape, classes, convolutional)
MODELS = {
    "resnet50": (lambda: resnet("resnet50"), (3, 224, 224), 1000, True),
    "resnet18_cifar": (lambda: resnet("resnet18_cifar"), (3, 32, 32), 10, True),
    "lenet5": (LeNet5, (1, 28, 28), 10, True),
    "mlp": (lambda: mlp([1024, 1024]), (1, 28, 28), 10, False),
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=sorted(MODELS) + ["gpt2"], required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--precision", choices=["fp32", "bf16"], required=True)
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--ddp", action="store_true")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.01)
    args = ap.parse_args()
    if args.model == "gpt2":
        return gpt2_main(args)

    build, shape, classes, conv = MODELS[args.model]
    dev = torch.device("cuda")
    torch.manual_seed(0)
    # fixed shapes: let cuDNN pick its fastest algorithms, as traind plans each shape once
    torch.backends.cudnn.benchmark = True
    if args.precision == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    fmt = torch.channels_last if conv else torch.contiguous_format
    model = build().to(dev, memory_format=fmt)
    if args.ddp:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                                world_size=1)
        model = DistributedDataParallel(model, device_ids=[0])
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    run = torch.compile(model) if args.mode == "compile" else model
    pool = [(torch.rand(args.batch, *shape, device=dev).contiguous(memory_format=fmt),
             torch.randint(0, classes, (args.batch,), device=dev)) for _ in range(4)]

    def step(i):
        x, y = pool[i % len(pool)]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = F.cross_entropy(run(x), y)
        loss.backward()
        opt.step()

    for i in range(args.warmup):  # cuDNN's search, torch.compile's compilation
        step(i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(args.steps):
        step(i)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print(json.dumps({"impl": "pytorch", "model": args.model, "batch": args.batch,
                      "precision": args.precision, "mode": args.mode, "ddp": args.ddp,
                      "img_per_s": args.steps * args.batch / dt, "torch": torch.__version__,
                      "device": torch.cuda.get_device_name(0)}))
    if args.ddp:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
