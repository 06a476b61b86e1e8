#!/usr/bin/env python3
"""Writes the fuzzers' seed corpora, tests/fuzz/corpus/<harness>/seed-*: the repository's
example and fixture specs, and small files of every format built here byte by byte, each in the
framing its harness documents (fuzz_<harness>.c). Run it after changing a format or a harness's
framing; the files it writes are committed (CI replays them, and never runs this).

Regression inputs (crash-*, found by fuzzing) live beside the seeds and are left alone."""
import gzip
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def put(harness, name, data):
    d = os.path.join(HERE, "corpus", harness)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


def compact(o):
    return json.dumps(o, separators=(",", ":"))


# ---- job specs -----------------------------------------------------------------------------

def specs():
    """Specs covering every section, preset, op, optimizer, schedule and data format."""
    out = {}
    for name in ("examples/fmnist-lenet.json", "tests/fixtures/resnet18-tiny.json",
                 "examples/shakespeare-gpt.json"):
        with open(os.path.join(ROOT, name)) as f:
            out[os.path.basename(name)[:-5]] = json.load(f)
    synth = {"format": "synthetic", "shape": [3, 8, 8], "num_classes": 4, "size": 16,
             "val_size": 4}
    train = {"batch_size": 4, "epochs": 2, "seed": 1,
             "optimizer": {"type": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": True,
                           "dampening": 0, "weight_decay": 1e-4}}
    out["graph"] = {
        "name": "graph",
        "model": {"num_classes": 4, "nodes": [
            {"name": "conv1", "op": "conv2d", "out_channels": 4, "kernel_size": 3, "padding": 1,
             "stride": 1, "bias": False, "init": "kaiming_normal_fan_out",
             "algorithm": "im2col"},
            {"name": "bn1", "op": "batchnorm2d", "eps": 1e-5, "momentum": 0.1, "affine": True,
             "track_running_stats": True, "zero_init": False},
            {"name": "relu1", "op": "relu"},
            {"name": "conv2", "op": "conv2d", "out_channels": 4, "kernel_size": 3, "padding": 1},
            {"name": "skip", "op": "add", "inputs": ["conv2", "relu1"]},
            {"name": "pool", "op": "maxpool2d", "kernel_size": 2, "stride": 2, "padding": 0},
            {"name": "avg", "op": "avgpool2d", "kernel_size": 2, "count_include_pad": True},
            {"name": "gap", "op": "adaptive_avgpool2d", "output_size": 1},
            {"name": "flat", "op": "flatten"},
            {"name": "id", "op": "identity"},
            {"name": "drop", "op": "dropout", "p": 0.25},
            {"name": "fc1", "op": "linear", "out_features": 8, "bias": True},
            {"name": "bn2", "op": "batchnorm1d"},
            {"name": "gelu", "op": "gelu", "approximate": "tanh"},
            {"name": "fc", "op": "linear", "out_features": 4}]},
        "data": dict(synth, normalize={"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]},
                     augment={"random_crop": {"padding": 2}, "horizontal_flip": True},
                     num_workers=2),
        "train": dict(train, threads=2, shuffle=False, drop_last=True, clip_grad_norm=1.0,
                      grad_accum=2, sync_bn=False, device="cpu", precision="fp32",
                      activation_checkpointing=["conv1", {"first": "conv2", "last": "skip"}],
                      schedule={"type": "multistep", "milestones": [2, 4], "gamma": 0.5,
                                "warmup_steps": 1},
                      loss={"type": "cross_entropy", "label_smoothing": 0.1}),
        "log": {"every_steps": 1},
        "checkpoint": {"dir": "ck", "every_steps": 2, "every_epochs": 1, "keep": 2},
        "resume_from": "latest",
        "distributed": {"bucket_cap_mb": 1, "backend": "cpu"}}
    out["mlp"] = {
        "model": {"preset": "mlp", "hidden": [16, 8], "activation": "gelu", "dropout": 0.1,
                  "num_classes": 3, "init_from": "w.safetensors", "strict": False},
        "data": {"format": "csv", "train": {"path": "train.csv"}, "val": {"path": "val.csv"},
                 "label_column": 0, "header": True, "normalize": {"mean": [0], "std": [1]}},
        "train": dict(train, optimizer={"type": "adamw", "lr": 1e-3, "betas": [0.9, 0.999],
                                        "eps": 1e-8, "weight_decay": 0.01},
                      schedule={"type": "cosine", "min_lr": 1e-5, "warmup_steps": 2},
                      loss={"type": "mse"}, max_steps=10, eval_batch_size=8)}
    out["cifar"] = {
        "model": {"preset": "resnet18", "num_classes": 10, "stem": "cifar",
                  "zero_init_residual": True},
        "data": {"format": "cifar10", "train": {"files": ["data_batch_1.bin", "data_batch_2.bin"]},
                 "val": {"files": ["test_batch.bin"]}},
        "train": dict(train, optimizer={"type": "adam", "lr": 1e-3},
                      schedule={"type": "step", "step_size": 10, "gamma": 0.1},
                      precision="bf16", device="auto", cuda_graph=False, cudnn_benchmark=True,
                      deterministic=False),
        "distributed": {"backend": "nccl"}}
    out["npy"] = {
        "model": {"preset": "cifar_net", "num_classes": 10},
        "data": {"format": "npy", "train": {"images": "x.npy", "labels": "y.npy"},
                 "layout": "NHWC"},
        "train": dict(train, schedule={"type": "linear", "end_factor": 0.1}, precision="fp16",
                      device="cuda")}
    out["gpt-nodes"] = {
        "model": {"nodes": [
            {"name": "wte", "op": "embedding", "num_embeddings": 65, "embedding_dim": 8,
             "init_std": 0.02},
            {"name": "wpe", "op": "position_embedding", "block_size": 16},
            {"name": "ln", "op": "layernorm", "eps": 1e-5, "bias": False},
            {"name": "qkv", "op": "linear", "out_features": 24},
            {"name": "attn", "op": "causal_attention", "n_head": 2, "dropout": 0.1},
            {"name": "res", "op": "add", "inputs": ["attn", "wpe"]},
            {"name": "head", "op": "linear", "out_features": 65, "bias": False,
             "weight_from": "wte"}]},
        "data": {"format": "text", "train": {"path": "input.txt"}, "val": {"path": "val.txt"},
                 "tokenizer": "byte", "block_size": 16, "val_fraction": 0.1, "num_workers": 0},
        "train": dict(train, max_steps=4, eval_every_steps=2,
                      optimizer={"type": "adamw", "lr": 1e-3, "decay": "matrices"}),
        "sample": {"prompt": "\n", "tokens": 8, "temperature": 0.8, "top_k": 4, "seed": 1}}
    out["gpt2-tokens"] = {
        "model": {"preset": "gpt2", "n_layer": 2, "bias": False, "dropout": 0},
        "data": {"format": "tokens", "train": {"path": "train.bin"}, "val": {"path": "val.bin"},
                 "vocab_size": 50257, "block_size": 1024},
        "train": dict(train, max_steps=2)}
    out["gpt-bpe"] = {
        "model": {"preset": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32,
                  "bias": False, "dropout": 0.2},
        "data": {"format": "text", "train": {"path": "input.txt"}, "tokenizer": "gpt2",
                 "block_size": 32, "val_fraction": 0.05},
        "train": dict(train, max_steps=3, eval_every_steps=1, eval_iters=2),
        "sample": {"prompt": "Hello", "tokens": 4, "top_k": 5}}
    out["tokens-npy"] = {
        "model": {"preset": "gpt", "n_layer": 1, "n_head": 1, "n_embd": 8},
        "data": {"format": "tokens", "train": {"path": "train.npy"}, "vocab_size": 50257,
                 "block_size": 8},
        "train": dict(train, max_steps=1)}
    out["resnet50"] = {"model": {"preset": "resnet50", "num_classes": 100, "stem": "imagenet"},
                       "data": dict(synth, shape=[3, 32, 32], num_classes=100),
                       "train": dict(train, batch_size=2),
                       "resume_from": "/tmp/ck/step-00000010"}
    return out


def spec_seeds():
    for name, spec in specs().items():
        put("spec", name, json.dumps(spec, indent=1))
    put("spec", "minimal", compact({"model": {"preset": "lenet5", "num_classes": 10},
                                    "data": {"format": "synthetic", "shape": [1, 28, 28],
                                             "num_classes": 10, "size": 8},
                                    "train": {"batch_size": 2,
                                              "optimizer": {"type": "sgd", "lr": 0.1}}}))


# ---- submissions (fuzz_submit.c: "@DATA@" is the data root) ---------------------------------

def submit_seeds():
    d = "@DATA@"
    lenet = {"preset": "lenet5", "num_classes": 3}
    small = {"nodes": [{"name": "f", "op": "flatten"},
                       {"name": "fc", "op": "linear", "out_features": 3}], "num_classes": 3}
    tr = {"batch_size": 2, "epochs": 1, "optimizer": {"type": "sgd", "lr": 0.1}}
    jobs = {
        "idx": {"name": "idx", "model": small,
                "data": {"format": "idx",
                         "train": {"images": d + "/images.idx", "labels": d + "/labels.idx"},
                         "val": {"images": d + "/images.idx.gz",
                                 "labels": d + "/labels.idx.gz"}},
                "train": tr, "resources": {"nproc": 2, "time_limit_s": 3600},
                "restart": {"max_restarts": 2}, "priority": 5,
                "checkpoint": {"every_steps": 10}},
        "npy": {"model": small,
                "data": {"format": "npy", "layout": "NCHW",
                         "train": {"images": d + "/images.npy", "labels": d + "/labels.npy"}},
                "train": tr, "checkpoint": {"dir": d + "/ck", "keep": 1},
                "resume_from": d + "/ck/step-00000001"},
        "csv": {"model": {"preset": "mlp", "hidden": [4], "num_classes": 3},
                "data": {"format": "csv", "train": {"path": d + "/data.csv"}, "header": True,
                         "label_column": 0},
                "train": tr, "resources": {"nproc_per_node": 1, "nnodes": 2,
                                           "nodes": ["n1", "n2"]}},
        "cifar": {"model": {"preset": "cifar_net", "num_classes": 10},
                  "data": {"format": "cifar10", "train": {"files": [d + "/cifar.bin"]},
                           "val": {"files": [d + "/cifar.bin", d + "/cifar.bin"]}},
                  "train": tr},
        "synthetic": dict(specs()["fmnist-lenet"],
                          data={"format": "synthetic", "shape": [1, 28, 28], "num_classes": 10,
                                "size": 8}),
        "outside": {"model": lenet,
                    "data": {"format": "idx", "train": {"images": "/etc/passwd",
                                                        "labels": d + "/../../labels.idx"}},
                    "train": tr},
        "command": {"name": "cmd", "command": ["/usr/bin/python3", "train.py", "--epochs", "2"],
                    "env": {"PYTHONUNBUFFERED": "0", "SEED": "1"},
                    "local_rank_arg": "--local-rank",
                    "resources": {"nproc_per_node": 2, "gpus_per_proc": 1,
                                  "visible_gpus": "job"}, "restart": {"max_restarts": 1}},
        "allowed": {"command": ["true"], "env": {"PATH": "/usr/local/bin:/bin:."}},
        "preload": {"command": ["/usr/bin/env", "python3"], "env": {"LD_PRELOAD": "x.so"}},
        "spawn": {"command": ["python3", "spawn.py"], "launch": "self", "local_rank_arg": False,
                  "resources": {"nproc_per_node": 4, "gpus_per_proc": 2, "nnodes": 2,
                                "visible_gpus": "own"}},
    }
    for name, body in jobs.items():
        put("submit", name, json.dumps(body, indent=1))


# ---- the daemon's config file ----------------------------------------------------------------

def config_seeds():
    with open(os.path.join(ROOT, "deploy/traind.json")) as f:
        put("daemon_config", "deploy-traind", f.read())
    full = {"listen": "0.0.0.0:8470", "state_dir": "/var/lib/traind", "slots": 4,
            "gpus": [{"index": 0, "name": "NVIDIA H100", "memory_gib": 80}, {"index": 2}],
            "data_roots": ["/data", "/usr/share/datasets"], "grace_s": 2.5,
            "max_body_bytes": 4096, "worker": "/usr/bin/traind-worker", "web_root": "/srv/web",
            "log_format": "json", "log_level": "debug",
            "cluster_secret_file": "/etc/traind/secret", "join": "10.0.0.1:8470",
            "node_name": "n1", "advertise": "10.0.0.2", "heartbeat_s": 1,
            "node_timeout_s": 5, "tls_cert": "/etc/traind/cert.pem",
            "tls_key": "/etc/traind/key.pem", "tls_ca": "/etc/traind/ca.pem",
            "keep_jobs_on_stop": False, "orphan_timeout_s": 30,
            "shepherd": "/usr/lib/traind/traind-shepherd", "metrics_listen": "127.0.0.1:9470"}
    put("daemon_config", "full", json.dumps(full, indent=1))
    put("daemon_config", "gpus-list", compact({"gpus": [0, 1, 3], "data_roots": [],
                                               "slots": 1}))
    put("daemon_config", "empty", "{}")


# ---- cluster conversations (fuzz_cluster.c: NUL-separated, a letter then a body) -------------

def cluster_seeds():
    reg = {"protocol": 3, "name": "n1", "node_id": "0123456789abcdef", "address": "10.0.0.2",
           "slots": 2, "gpus": [{"index": 0, "name": "Test GPU", "memory_bytes": 1024},
                                {"index": 3, "name": None, "memory_bytes": None}],
           "version": "0.1.0", "slots_used": 0, "parts": []}
    hb = {"name": "n1", "node_id": "0123456789abcdef", "slots_used": 1, "parts": []}
    cpu = dict(reg, name="n2", node_id="fedcba9876543210", slots=4, gpus=[])
    msgs = ["A" + "Cluster 0123456789abcdef0123", "R" + compact(reg), "H" + compact(hb),
            "R" + compact(cpu), "Dn2", "Dm0", "Um0", "S11", "H" + compact(hb),
            "R" + compact(reg), "Un2"]
    put("cluster", "join-beat-lose", "\0".join(msgs))
    put("cluster", "old-protocol", "R" + compact(dict(reg, protocol=2)))
    put("cluster", "taken", "\0".join(["R" + compact(dict(reg, name="m0")), "R" + compact(reg),
                                       "R" + compact(dict(reg, node_id="another-node-id"))]))


# ---- HTTP (fuzz_http_range.c: 8 bytes of file size, then the header) ---------------------------

def http_seeds():
    for name, size, h in (("a-b", 1000, "bytes=0-99"), ("open", 1000, "bytes=500-"),
                          ("suffix", 1000, "bytes=-200"), ("past", 10, "bytes=5-50"),
                          ("empty-file", 0, "bytes=0-0"), ("two", 100, "bytes=0-1,5-6"),
                          ("big", 1 << 40, "bytes=9223372036854775807-")):
        put("http_range", name, struct.pack("<Q", size) + h.encode())
    for name, url in (("events", "/v1/jobs/12/events?last_event_id=40"),
                      ("list", "/v1/jobs?state=running&limit=50&offset=0"),
                      ("logs", "/v1/jobs/3/logs?rank=1&follow=1"),
                      ("ckpt-file", "/v1/jobs/7/checkpoints/400/model.safetensors"),
                      ("ckpt-sub", "/v1/jobs/7/checkpoints/400/sub/rank-0.pt"),
                      ("ckpt-tar", "/v1/jobs/7/checkpoints/400.tar"),
                      ("ckpt-escape", "/v1/jobs/7/checkpoints/1/../outside/secret"),
                      ("ckpt-link", "/v1/jobs/7/checkpoints/1/linkdir/secret"),
                      ("files", "/v1/cluster/files/9/checkpoints/step-00000010/state.json"),
                      ("files-bad", "/v1/cluster/files/9/../x?sha256=00ff"),
                      ("event-id", "18446744073709551615")):
        put("http_path", name, url)


# ---- the shepherd's files (fuzz_shepherd.c) ----------------------------------------------------

def shepherd_seeds():
    spec = {"argv": ["/usr/bin/traind-worker", "/var/lib/traind/jobs/1/spec.json"],
            "env": ["TRAIND_JOB_ID=1"], "devices": ["0"], "logs": ["/j/1/rank-0.log"],
            "dir": "/j/1", "output": "/j/1/attempt-1.node-0.out",
            "socket": "/j/1/attempt-1.node-0.sock", "status": "/j/1/attempt-1.node-0.status",
            "master_addr": "127.0.0.1", "master_port": 29500, "run_id": "traind-job-1",
            "nproc": 1, "nnodes": 1, "node_rank": 0, "max_restarts": 0, "attempt": 1,
            "token": "00112233445566778899aabbccddeeff", "boot_id": "7f0c5e0e-boot",
            "daemon_fd": 3, "listen_fd": 4, "grace_s": 10, "deadline": 0,
            "orphan_timeout_s": 600, "launch_self": False, "no_cpu_bind": False,
            "daemon": {"job": 1, "attempt": 1, "node_rank": 0, "nnodes": 1, "nproc": 1,
                       "procs": 1, "n_slots": 1, "gpu_slots": [0], "see_all_gpus": False,
                       "kind": "train", "log_start": [0], "uid": 0, "cgroup": ""}}
    status = {"attempt": 1, "exit_code": 0, "failed": False, "failed_rank": -1,
              "reason": "", "stopped_by": "request", "stop_reason": "cancelled by the user",
              "grace_expired": False, "grace_note": "", "output_bytes": 1234}
    lines = ("pid 4242 2\nout 100\nfailed 1 3 1732500000.250 rank 1 (pid 4244) exited with "
             "status 3\nout 250\npid 4242 0\nover\n")
    put("shepherd", "ended", json.dumps(spec, indent=2) + "\n--status--\n" + compact(status) +
        "\n--lines--\n" + lines)
    put("shepherd", "running", json.dumps(spec) + "\n--status--\n\n--lines--\nout 7\npid 9 1\n")
    put("shepherd", "torn", json.dumps(spec)[:200] + "\n--status--\n" + compact(status)[:40])


# ---- data files ------------------------------------------------------------------------------

def idx_files(n=3, h=4, w=4):
    images = struct.pack(">IIII", 0x803, n, h, w) + bytes((i * 5) % 256 for i in range(n * h * w))
    labels = struct.pack(">II", 0x801, n) + bytes(i % 10 for i in range(n))
    return images, labels


def npy(descr, shape, data):
    d = "{'descr': '%s', 'fortran_order': False, 'shape': %r, }" % (descr, tuple(shape))
    pad = (64 - (10 + len(d) + 1) % 64) % 64
    header = d + " " * pad + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data


def data_seeds():
    images, labels = idx_files()
    sep = b"--labels--"
    put("idx", "plain", b"\0" + images + sep + labels)
    put("idx", "gz-here", b"\3" + images + sep + labels)
    put("idx", "gz-files", b"\0" + gzip.compress(images, mtime=0) + sep +
        gzip.compress(labels, mtime=0))
    put("idx", "mismatch", b"\0" + images + sep + idx_files(n=2)[1])
    put("npy", "u1-nchw", b"\0" + npy("|u1", (3, 1, 4, 4), bytes(range(48))) + sep +
        npy("<i8", (3,), struct.pack("<3q", 0, 1, 2)))
    put("npy", "f4-nhwc", b"\1" + npy("<f4", (2, 2, 2, 3), struct.pack("<24f", *range(24))) +
        sep + npy("<i4", (2,), struct.pack("<2i", 1, 0)))
    put("npy", "f4-flat", b"\0" + npy("<f4", (2, 5), struct.pack("<10f", *range(10))) + sep +
        npy("|i1", (2,), b"\1\0"))
    put("npy", "u1-hw", b"\0" + npy("|u1", (2, 3, 3), bytes(18)) + sep +
        npy("<u2", (2,), struct.pack("<2H", 7, 300)))
    for name, flags, text in (("plain", 0, "0,1.5,2\n1,0.5,3\n2,-1,1e-3\n"),
                              ("header", 1, "label,x,y\n1,2,3\n0,4,5\r\n\n"),
                              ("column2", 4, "0.5,1.5,2,9\n1,2,3,4\n"),
                              ("bad-cell", 0, "0,1,x\n"),
                              ("ragged", 0, "0,1,2\n1,2\n")):
        put("csv", name, bytes([flags]) + text.encode())
    for name, flags, text in (("char", 2 * 3, "First Citizen:\nBefore we proceed any further"),
                              ("unicode", 2 * 1, "na\u00efve \u00e9t\u00e9 \u2014 \U0001f600 ok\n"),
                              ("byte", 1 + 2 * 7, "\u00ff\u00fe bytes, any of them"),
                              ("no-val", 16, "to be or not to be"),
                              ("bad-utf8", 0, None), ("short", 2 * 7, "abc"),
                              ("gpt2", 32, "Don't stop: 12,345 étés 日本  \n\n  ok"),
                              ("gpt2-bad-utf8", 32, None)):
        data = text.encode() if text is not None else b"ok\nthen \xc3\x28 here"
        put("text", name, bytes([flags]) + data)
    rec = bytes([3]) + bytes((i * 7) % 256 for i in range(3072))
    put("cifar", "two-records", rec + bytes([9]) + rec[1:])
    put("cifar", "cifar100-label", bytes([42]) + rec[1:])
    put("cifar", "short", rec[:3000])


# ---- safetensors and state.json --------------------------------------------------------------

def safetensors(tensors, metadata=None):
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = compact(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


def floats(n, fmt="<%df"):
    return struct.pack(fmt % n, *[i / 8 for i in range(n)])


def checkpoint_seeds():
    # the names of fuzz_safetensors.c's model
    model = [("c1.weight", "F32", [2, 1, 3, 3], floats(18)), ("c1.bias", "F32", [2], floats(2)),
             ("bn1.weight", "F32", [2], floats(2)), ("bn1.bias", "F32", [2], floats(2)),
             ("bn1.running_mean", "F32", [2], floats(2)),
             ("bn1.running_var", "F32", [2], floats(2)),
             ("bn1.num_batches_tracked", "I64", [], struct.pack("<q", 5)),
             ("fc.weight", "F32", [3, 32], floats(96)), ("fc.bias", "F32", [3], floats(3))]
    put("safetensors", "model", safetensors(model, {"format": "pt"}))
    put("safetensors", "partial", safetensors(model[:3] + [("extra", "F32", [1], floats(1))]))
    put("safetensors", "dtypes", safetensors([
        ("f64", "F64", [2], floats(2, "<%dd")), ("f16", "F16", [2], b"\x00\x3c\x00\xc0"),
        ("bf16", "BF16", [2], b"\x80\x3f\x00\x40"), ("i32", "I32", [1, 1], b"\xff\xff\xff\xff"),
        ("empty", "F32", [0, 4], b"")]))
    put("safetensors", "mismatch", safetensors([("fc.weight", "F32", [32, 3], floats(96))]))
    state = {"format": "traind-checkpoint", "version": 1, "step": 400, "epoch": 2, "batch": 13,
             "seed_hex": "000000000000002a",
             "rng": {"dropout": ["9e3779b97f4a7c15", "bf58476d1ce4e5b9", "94d049bb133111eb",
                                 "0000000000000001"]},
             "optimizer": {"steps": 400},
             "interval": {"loss_sum": "1.2345678901234567", "steps": 3}}
    put("checkpoint_state", "sgd", json.dumps(state, indent=2))
    put("checkpoint_state", "fp16", json.dumps(dict(state, grad_scaler={
        "scale": 65536.0, "growth_tracker": 17, "skipped_steps": 3}), indent=2))
    put("checkpoint_state", "other-version", compact(dict(state, version=2)))


# ---- experiments (fuzz_experiment.c) ---------------------------------------------------------

def experiment_seeds():
    job = {"name": "b", "model": {"preset": "lenet5"}, "train": {"epochs": 1, "optimizer": {"lr": 0.1}},
           "layers": [{"w": 1}, {"w": 2}]}
    grid = {"type": "grid", "metric": "loss", "mode": "min"}
    put("experiment", "grid", json.dumps({"name": "g", "job": job, "searcher": grid, "space": {
        "train.optimizer.lr": {"grid": [0.01, 0.1]}, "layers[1].w": {"choice": [1, "x", None]}}},
        indent=1))
    put("experiment", "random", json.dumps({"job": {"name": "c", "command": ["true"]}, "seed": 9,
        "max_concurrent": 3, "priority": 2,
        "searcher": {"type": "random", "metric": "score", "mode": "max", "max_trials": 20},
        "space": {"env.LR": {"log_uniform": [1e-5, 1]}, "env.N": {"int": [1, 64]},
                  "env.X": {"uniform": [-1, 1]}, "train.schedule.warmup": {"grid": [1, 2]}}},
        indent=1))
    put("experiment", "refused-prefix", compact({"job": job, "searcher": grid, "space": {
        "train": {"grid": [{}]}, "train.lr": {"grid": [1]}}}))
    put("experiment", "through-a-number", compact({"job": job, "searcher": grid, "space": {
        "train.epochs.x": {"grid": [1]}}}))


def main():
    experiment_seeds()
    spec_seeds()
    submit_seeds()
    config_seeds()
    cluster_seeds()
    http_seeds()
    shepherd_seeds()
    data_seeds()
    checkpoint_seeds()
    return 0


if __name__ == "__main__":
    sys.exit(main())
