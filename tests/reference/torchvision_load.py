"""Loads a traind checkpoint's model.safetensors into torchvision's resnet18 with strict=True and
writes its eval-mode logits on a fixed input, for tests/test_checkpoint.c to compare with the
engine's own forward.

usage: /usr/bin/python3 torchvision_load.py CHECKPOINT_DIR OUT_DIR
The safetensors file is parsed here with the standard library and numpy on purpose: the point
is that a file written by traind's C code is read by an independent implementation.
"""
import json
import os
import struct
import sys

import numpy as np
import torch
import torchvision

DTYPES = {"F32": np.float32, "I64": np.int64}


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hlen])
    data = raw[8 + hlen:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        array = np.frombuffer(data[begin:end], dtype=DTYPES[info["dtype"]])
        tensors[name] = torch.from_numpy(array.copy()).reshape(info["shape"])
    return tensors


def main():
    ckpt, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    model = torchvision.models.resnet18(num_classes=10)
    model.load_state_dict(read_safetensors(os.path.join(ckpt, "model.safetensors")), strict=True)
    model.eval()
    torch.manual_seed(0)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        logits = model(x)
    x.permute(0, 2, 3, 1).contiguous().numpy().astype(np.float32).tofile(os.path.join(out, "input.f32"))
    logits.numpy().astype(np.float32).tofile(os.path.join(out, "logits.f32"))


if __name__ == "__main__":
    main()
