"""A stand-in for torch.utils.tensorboard.SummaryWriter's scalars, for tests: PyTorch's own needs
the tensorboard package, which Debian 12 does not have. It writes what SummaryWriter writes for
add_scalar, byte for byte in the wire format: a file events.out.tfevents.<seconds>.<host>.<pid>.<n>
in log_dir (default runs/<date>_<host>, as SummaryWriter's), a version record ("brain.Event:2"),
then one Event per scalar (wall_time, step, summary { value { tag, simple_value } }), each a
TFRecord with masked CRC32Cs (tfevents.py). A script imports it only when torch's cannot load:

    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        from summary_writer import SummaryWriter"""
import datetime
import os
import socket
import struct
import time

import tfevents

_count = 0


def _varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number, wire, payload):
    key = _varint(number << 3 | wire)
    if wire == 2:
        return key + _varint(len(payload)) + payload
    return key + payload


def _record(data):
    header = struct.pack("<Q", len(data))
    return (header + struct.pack("<I", tfevents.masked_crc32c(header)) + data
            + struct.pack("<I", tfevents.masked_crc32c(data)))


class SummaryWriter:
    def __init__(self, log_dir=None):
        global _count
        if log_dir is None:
            stamp = datetime.datetime.now().strftime("%b%d_%H-%M-%S")
            log_dir = os.path.join("runs", stamp + "_" + socket.gethostname())
        os.makedirs(log_dir, exist_ok=True)
        _count += 1
        name = "events.out.tfevents.%d.%s.%d.%d" % (time.time(), socket.gethostname(),
                                                     os.getpid(), _count)
        self.file = open(os.path.join(log_dir, name), "wb")
        self._event(_field(3, 2, b"brain.Event:2"), 0)

    def _event(self, what, step):
        data = (_field(1, 1, struct.pack("<d", time.time())) + _field(2, 0, _varint(step))
                + what)
        self.file.write(_record(data))

    def add_scalar(self, tag, scalar_value, global_step=None):
        value = _field(1, 2, tag.encode()) + _field(2, 5, struct.pack("<f", float(scalar_value)))
        self._event(_field(5, 2, _field(1, 2, value)), global_step or 0)

    def flush(self):
        self.file.flush()

    def close(self):
        self.file.close()
