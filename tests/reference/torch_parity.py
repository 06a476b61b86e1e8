"""Reference for tests/test_torch_parity.c: a small conv net in PyTorch, its weights, one input
batch, and its logits, loss and every gradient, written as raw float32 with a JSON index.

usage: /usr/bin/python3 torch_parity.py OUTDIR
The net must match PARITY_NODES in test_torch_parity.c node for node.
"""
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 6, 3, stride=2, padding=1)
        self.conv3 = nn.Conv2d(6, 6, 1, bias=False)
        self.fc1 = nn.Linear(6 * 3 * 3, 20)
        self.fc2 = nn.Linear(20, 5)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)          # 8 x 6 x 6
        y = F.gelu(self.conv2(x))                            # 6 x 3 x 3
        x = y + self.conv3(y)                                # residual add
        x = F.avg_pool2d(x, 3, stride=1, padding=1)          # 6 x 3 x 3
        x = torch.flatten(x, 1)
        return self.fc2(F.relu(self.fc1(x)))


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(1234)
    net = Net()
    x = torch.randn(4, 3, 12, 12)
    y = torch.tensor([0, 3, 1, 4])
    logits = net(x)
    loss = F.cross_entropy(logits, y, label_smoothing=0.1)
    loss.backward()

    index, blobs, offset = {}, [], 0

    def put(name, t):
        nonlocal offset
        t = t.detach().contiguous().float()
        index[name] = {"offset": offset, "shape": list(t.shape)}
        blobs.append(t.numpy().tobytes())
        offset += t.numel()

    # NHWC, as traind stores activations
    put("input", x.permute(0, 2, 3, 1))
    put("labels", y.float())
    put("logits", logits)
    put("loss", loss.reshape(1))
    for name, p in net.named_parameters():
        put(name, p)
        put(name + ".grad", p.grad)
    with open(os.path.join(out, "parity.bin"), "wb") as f:
        f.write(b"".join(blobs))
    with open(os.path.join(out, "parity.json"), "w") as f:
        json.dump(index, f)


if __name__ == "__main__":
    main()
