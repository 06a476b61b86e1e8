"""The PyTorch side of bench/cpu.sh: trains the same model, batch size and optimizer as the
traind-worker run on synthetic data of the same shape, and prints one JSON line with img/s.

Run with /usr/bin/python3 (Debian's python3-torch). Threads are pinned by the caller through
OPENBLAS_NUM_THREADS/OMP_NUM_THREADS and here through torch.set_num_threads.
"""
import argparse
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class LeNet5(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(256, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def mlp(hidden, classes=10):
    layers, width = [nn.Flatten()], 784
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def resnet18_cifar(classes=10):
    import torchvision
    m = torchvision.models.resnet18(num_classes=classes)
    m.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)  # the CIFAR stem: 3x3, stride 1,
    m.maxpool = nn.Identity()                         # no max-pool
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["lenet5", "mlp", "resnet18_cifar"], required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lr", type=float, default=0.01)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = {"lenet5": LeNet5, "mlp": lambda: mlp([512, 512]),
             "resnet18_cifar": resnet18_cifar}[args.model]()
    shape = (3, 32, 32) if args.model == "resnet18_cifar" else (1, 28, 28)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    # A fixed pool of synthetic batches, like the worker's synthetic dataset: no loader cost.
    pool = [(torch.rand(args.batch, *shape), torch.randint(0, 10, (args.batch,)))
            for _ in range(8)]

    def step(i):
        x, y = pool[i % len(pool)]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    for i in range(args.warmup):
        step(i)
    t0 = time.perf_counter()
    for i in range(args.steps):
        step(i)
    dt = time.perf_counter() - t0
    print(json.dumps({"impl": "pytorch", "model": args.model, "batch": args.batch,
                      "threads": args.threads, "img_per_s": args.steps * args.batch / dt,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
