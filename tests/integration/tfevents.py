#!/usr/bin/python3
"""Reads TensorBoard event files, the ones traind writes for a job's scalars (service/run/td_tboard.c),
with the standard library only: tests check what the daemon wrote without TensorFlow, TensorBoard
or the protobuf package, and check it strictly (every CRC, every byte of the wire format), where
TensorBoard would quietly stop at a bad record.

A file is a sequence of TFRecords:

    uint64 length, uint32 masked CRC32C of those 8 bytes, data, uint32 masked CRC32C of data

little-endian, mask(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8, each data one serialized
tensorboard.Event; the field numbers read here are those of TensorBoard's
tensorboard/compat/proto/event.proto and summary.proto (service/run/td_tboard.proto says which).

    /usr/bin/python3 tests/integration/tfevents.py DIR     prints the scalars of DIR"""
import glob
import os
import struct
import sys

_POLY = 0x82F63B78  # Castagnoli's polynomial, bit-reversed: CRC-32C as iSCSI and TFRecords use it


def _table():
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _table()


def crc32c(data):
    """The standard CRC-32C of data (bytes): crc32c(b"123456789") == 0xE3069283."""
    crc = 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data):
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class _WireError(Exception):
    """Bad protobuf wire format; read_events names the file and record around it."""


def _varint(buf, i):
    value = shift = 0
    while True:
        if i >= len(buf):
            raise _WireError("varint runs past the end")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7
        if shift >= 70:
            raise _WireError("varint longer than 10 bytes")


def _fields(buf):
    """(field number, wire type, value) of each field of a message: an int for varints, bytes for
    the fixed-width and length-delimited types, which the caller decodes as its field's type."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise _WireError("field number 0")
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 1 or wire == 5:
            n = 8 if wire == 1 else 4
            if i + n > len(buf):
                raise _WireError("field %d runs past the end" % number)
            value, i = buf[i:i + n], i + n
        elif wire == 2:
            n, i = _varint(buf, i)
            if i + n > len(buf):
                raise _WireError("field %d runs past the end" % number)
            value, i = buf[i:i + n], i + n
        else:  # 3 and 4 are proto2 groups, which none of these messages has; 6 and 7 do not exist
            raise _WireError("field %d has wire type %d" % (number, wire))
        yield number, wire, value


def _expect(number, wire, want):
    if wire != want:
        raise _WireError("field %d has wire type %d, not %d" % (number, wire, want))


def _string(b):
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _WireError("a string that is not UTF-8: %s" % e) from None


def _value(buf):
    """Summary.Value: (tag, simple_value or None)."""
    tag, simple = "", None
    for number, wire, v in _fields(buf):
        if number == 1:  # string tag
            _expect(number, wire, 2)
            tag = _string(v)
        elif number == 2:  # float simple_value
            _expect(number, wire, 5)
            simple = struct.unpack("<f", v)[0]
        elif number in (3, 4, 5, 6, 8):  # the oneof's other members: the last one set wins
            simple = None
    return tag, simple


def _event(buf):
    ev = {"wall_time": 0.0, "step": 0, "file_version": None, "values": []}
    for number, wire, v in _fields(buf):
        if number == 1:  # double wall_time
            _expect(number, wire, 1)
            ev["wall_time"] = struct.unpack("<d", v)[0]
        elif number == 2:  # int64 step, two's complement in a varint
            _expect(number, wire, 0)
            v &= (1 << 64) - 1
            ev["step"] = v - (1 << 64) if v >= 1 << 63 else v
        elif number == 3:  # string file_version, in the oneof `what`
            _expect(number, wire, 2)
            ev["file_version"] = _string(v)
            ev["values"] = []
        elif number == 5:  # Summary summary, in the oneof `what`
            _expect(number, wire, 2)
            ev["file_version"] = None
            for n, w, value in _fields(v):
                if n == 1:  # repeated Value value
                    _expect(n, w, 2)
                    tag, simple = _value(value)
                    if simple is not None:  # images, histograms, tensors: not scalars
                        ev["values"].append((tag, simple))
        elif number in (4, 6, 7, 8, 9):  # the oneof's other members
            ev["file_version"] = None
            ev["values"] = []
    return ev


def read_events(path):
    """Every Event of the file at path, in order, as a dict: wall_time, step, file_version (None
    but in a version record) and values, the [(tag, float)] of its scalars. Raises ValueError,
    naming the file and the record's offset, when a record is cut short, a CRC does not match or
    the data is not an Event."""
    with open(path, "rb") as f:
        data = f.read()
    events, at = [], 0
    while at < len(data):
        if len(data) - at < 12:
            raise ValueError("%s: record at offset %d: truncated header (%d bytes)"
                             % (path, at, len(data) - at))
        header = data[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        (crc,) = struct.unpack("<I", data[at + 8:at + 12])
        if crc != masked_crc32c(header):
            raise ValueError("%s: record at offset %d: length CRC mismatch" % (path, at))
        if len(data) - at - 12 < length + 4:
            raise ValueError("%s: record at offset %d: truncated (%d bytes of data and CRC"
                             " announced, %d left)" % (path, at, length + 4, len(data) - at - 12))
        body = data[at + 12:at + 12 + length]
        (crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
        if crc != masked_crc32c(body):
            raise ValueError("%s: record at offset %d: data CRC mismatch" % (path, at))
        try:
            events.append(_event(body))
        except _WireError as e:
            raise ValueError("%s: record at offset %d: not an Event: %s" % (path, at, e)) from None
        at += 16 + length
    return events


def read_scalars(directory):
    """{tag: [(step, value)]} over the events.out.tfevents.* files of directory, files in name
    order (for one host, the order they were started in) and records in file order."""
    out = {}
    for path in sorted(glob.glob(os.path.join(glob.escape(directory), "events.out.tfevents.*"))):
        for ev in read_events(path):
            for tag, value in ev["values"]:
                out.setdefault(tag, []).append((ev["step"], value))
    return out


def main(argv):
    if len(argv) != 2:
        sys.stderr.write("usage: %s DIR\n" % argv[0])
        return 2
    for tag, points in sorted(read_scalars(argv[1]).items()):
        for step, value in points:
            print("%s\t%d\t%.9g" % (tag, step, value))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
