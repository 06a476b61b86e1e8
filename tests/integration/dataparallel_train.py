"""An nn.DataParallel script as the PyTorch tutorials write it: one process, the model wrapped in
DataParallel, which splits each batch over every GPU the process sees (on a machine without
GPUs it runs the model as it is). Under traind it is a job with one process
(nproc_per_node: 1) and, on GPUs, gpus_per_proc: N.

Prints {"event": "env", "step": 0, "vars": {...}, "gpus": torch.cuda.device_count(),
"wrapped": true} and then {"event": "train", "step", "loss"} for DP_STEPS steps (default 30)."""
import json
import os

import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, x):
        return self.body(x)


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = Net()
if torch.cuda.device_count() > 1:
    print(f"Let's use {torch.cuda.device_count()} GPUs!", flush=True)
model = nn.DataParallel(model).to(device)
names = ("CUDA_VISIBLE_DEVICES", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK", "LOCAL_RANK")
print(json.dumps({"event": "env", "step": 0, "vars": {k: os.environ.get(k) for k in names},
                  "gpus": torch.cuda.device_count(),
                  "wrapped": isinstance(model, nn.DataParallel)}), flush=True)

torch.manual_seed(0)
x = torch.randn(256, 20)
y = (x[:, 0] + x[:, 1] > 0).long()
opt = torch.optim.SGD(model.parameters(), lr=0.5)
loss_fn = nn.CrossEntropyLoss()
for step in range(int(os.environ.get("DP_STEPS", "30"))):
    loss = loss_fn(model(x.to(device)), y.to(device))
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(json.dumps({"event": "train", "step": step, "loss": loss.item()}), flush=True)
