"""Reference for tests/reference/test_torch_parity.c: a small conv net in PyTorch, its weights,
one input batch, and its logits, loss and every gradient; and a one-block GPT as nanoGPT's
model.py writes it (our own code, nanoGPT's architecture), its outputs and gradients. Each is
written as raw float32 with a JSON index (parity.*, gpt_parity.*).

usage: /usr/bin/python3 torch_parity.py OUTDIR
The nets must match PARITY_NODES and GPT_NODES in test_torch_parity.c node for node.
"""
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt_reference import GPT


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


# nanoGPT's GPT (one block by default); the head's weight is the token embedding's
TinyGPT = GPT


class Writer:
    def __init__(self):
        self.index, self.blobs, self.offset = {}, [], 0

    def put(self, name, t):
        t = t.detach().contiguous().float()
        self.index[name] = {"offset": self.offset, "shape": list(t.shape)}
        self.blobs.append(t.numpy().tobytes())
        self.offset += t.numel()

    def params(self, net):
        for name, p in net.named_parameters():
            self.put(name, p)
            self.put(name + ".grad", p.grad)

    def save(self, out, stem):
        with open(os.path.join(out, stem + ".bin"), "wb") as f:
            f.write(b"".join(self.blobs))
        with open(os.path.join(out, stem + ".json"), "w") as f:
            json.dump(self.index, f)


def convnet(out):
    torch.manual_seed(1234)
    net = Net()
    x = torch.randn(4, 3, 12, 12)
    y = torch.tensor([0, 3, 1, 4])
    logits = net(x)
    loss = F.cross_entropy(logits, y, label_smoothing=0.1)
    loss.backward()
    w = Writer()
    w.put("input", x.permute(0, 2, 3, 1))  # NHWC, as traind stores activations
    w.put("labels", y.float())
    w.put("logits", logits)
    w.put("loss", loss.reshape(1))
    w.params(net)
    w.save(out, "parity")


def gpt(out):
    """Logits of 3 sequences of 6 tokens, and the gradients of sum(logits · r) for a fixed r."""
    torch.manual_seed(4321)
    net = TinyGPT()
    for p in net.parameters():  # away from the init's symmetries (LayerNorm's ones and zeros)
        p.data.add_(0.1 * torch.randn_like(p))
    idx = torch.randint(0, 11, (3, 6))
    logits = net(idx)
    r = torch.randn_like(logits)
    (logits * r).sum().backward()
    w = Writer()
    w.put("input", idx.float())
    w.put("logits", logits)
    w.put("dlogits", r)
    w.params(net)
    w.save(out, "gpt_parity")


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    convnet(out)
    gpt(out)


if __name__ == "__main__":
    main()
