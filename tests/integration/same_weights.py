"""Compares two model.safetensors files tensor by tensor: the same names and shapes, and every
F32 value within a relative tolerance of the largest magnitude in its tensor. Reads the format
with the standard library (an 8-byte little-endian header length, a JSON header, raw data), so
the test needs no torch or numpy.
    same_weights.py A B TOLERANCE      exit 0 when they match, 1 (saying where) when not"""
import array
import json
import struct
import sys


def tensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, t in header.items():
        if t["dtype"] != "F32":
            sys.exit(f"{path}: {name}: dtype {t['dtype']}, expected F32")
        begin, end = t["data_offsets"]
        values = array.array("f")
        values.frombytes(blob[8 + n + begin:8 + n + end])
        if sys.byteorder != "little":
            values.byteswap()
        out[name] = (t["shape"], values)
    return out


def main():
    a, b, tol = tensors(sys.argv[1]), tensors(sys.argv[2]), float(sys.argv[3])
    if sorted(a) != sorted(b):
        sys.exit(f"different tensors: {sorted(a)} and {sorted(b)}")
    worst = 0.0
    for name in sorted(a):
        (sa, va), (sb, vb) = a[name], b[name]
        if sa != sb:
            sys.exit(f"{name}: shape {sa} and {sb}")
        scale = max(max((abs(x) for x in va), default=0.0), 1e-30)
        diff = max((abs(x - y) for x, y in zip(va, vb)), default=0.0)
        worst = max(worst, diff / scale)
        if diff > tol * scale:
            sys.exit(f"{name}: differs by {diff:.3g} (relative {diff / scale:.3g} > {tol})")
    print(f"same weights: {len(a)} tensors, worst relative difference {worst:.3g}")


main()
