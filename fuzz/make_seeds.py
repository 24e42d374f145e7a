#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora into fuzz/corpus/<target>/: small valid inputs of every
kind each parser accepts (the fuzzer mutates from there). Standard library only; run from anywhere:
  python3 fuzz/make_seeds.py
"""
import gzip
import json
import os
import shutil
import struct
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FIXTURES = os.path.join(ROOT, "tests", "io", "fixtures")


def target(name):
    d = os.path.join(HERE, "corpus", name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return d


def put(d, name, data):
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- protocol buffer wire format (enough for Example and the parameter server's messages) ----

def varint(v):
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_varint(num, v):
    return varint(num << 3) + varint(v)


def field_bytes(num, b):
    return varint((num << 3) | 2) + varint(len(b)) + b


def field_float(num, x):
    return varint((num << 3) | 5) + struct.pack("<f", x)


# ---- TFRecord and Example ----

def records(path):
    with open(path, "rb") as f:
        data = f.read()
    at, out = 0, []
    while at + 12 <= len(data):
        (n,) = struct.unpack_from("<Q", data, at)
        out.append(data[at + 12:at + 12 + n])
        at += 16 + n
    return out


d = target("tfrecord")
for prefix, name in ((0, "examples.tfrecord"), (1, "examples.tfrecord.zlib"),
                     (2, "examples.tfrecord.gz")):
    with open(os.path.join(FIXTURES, name), "rb") as f:
        put(d, name, bytes([prefix]) + f.read())
put(d, "empty", b"\x00")

d = target("example")
for i, r in enumerate(records(os.path.join(FIXTURES, "examples.tfrecord"))):
    put(d, "record-%d" % i, r)


def example(features):
    entries = b""
    for key, feature in features.items():
        entry = field_bytes(1, key.encode()) + field_bytes(2, feature)
        entries += field_bytes(1, entry)
    return field_bytes(1, entries)


floats = field_bytes(2, field_bytes(1, struct.pack("<4f", 1.0, 2.0, 3.0, 4.0)))  # packed
ints = field_bytes(3, field_bytes(1, b"".join(varint(v) for v in (1, -2, 3, 4))))
unpacked_ints = field_bytes(3, field_varint(1, 7) + field_varint(1, 8))
blobs = field_bytes(1, field_bytes(1, b"image bytes"))
put(d, "every-kind", example({"f": floats, "i": ints, "u": unpacked_ints, "b": blobs,
                              "none": b""}))

# ---- IDX ----

d = target("idx")


def idx(type_byte, dims, payload):
    return b"\x00\x00" + bytes([type_byte, len(dims)]) + b"".join(
        struct.pack(">I", x) for x in dims) + payload


put(d, "u8", idx(0x08, [2, 3], bytes(range(6))))
put(d, "i8", idx(0x09, [4], bytes([0, 127, 128, 255])))
put(d, "i16", idx(0x0B, [2], struct.pack(">2h", -3, 300)))
put(d, "i32", idx(0x0C, [1, 2], struct.pack(">2i", -70000, 5)))
put(d, "f32", idx(0x0D, [3], struct.pack(">3f", 0.5, -1.0, 1e30)))
put(d, "f64", idx(0x0E, [2], struct.pack(">2d", 0.25, -2.0)))
put(d, "u8.gz", gzip.compress(idx(0x08, [2, 2, 2], bytes(range(8))), mtime=0))

# ---- safetensors ----

d = target("safetensors")


def safetensors(tensors, metadata=None):
    header, blob = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob),
                                                                         len(blob) + len(data)]}
        blob += data
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + blob


put(d, "f32", safetensors({"w": ("F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)),
                           "b": ("F32", [2], struct.pack("<2f", 0.5, -0.5))},
                          {"format": "pt"}))
put(d, "half", safetensors({"h": ("F16", [3], struct.pack("<3e", 1.0, -2.5, 65504.0)),
                            "bf": ("BF16", [2], struct.pack("<2H", 0x3F80, 0xC000))}))
put(d, "f64-i64", safetensors({"d": ("F64", [2], struct.pack("<2d", 0.1, -3.0)),
                               "step": ("I64", [], struct.pack("<q", 42))}))
put(d, "empty", safetensors({"e": ("F32", [0, 3], b""), "s": ("F32", [], struct.pack("<f", 7))}))

# ---- the TOML configuration ----

d = target("config")
examples = os.path.join(ROOT, "examples")
for name in sorted(os.listdir(examples)):
    if name.endswith(".toml"):
        shutil.copy(os.path.join(examples, name), os.path.join(d, name))
put(d, "overrides.toml", b'[model]\nkind = "mlp"\n\n#--set\ntrain.epochs=3\n'
                         b'optimizer.lr=0.5\ndata.train_limit=100\n')

# ---- the TCP store's wire protocol ----

d = target("tcp_store")


def frame(body):
    return struct.pack("<I", len(body)) + body


def s(text):
    return struct.pack("<I", len(text)) + text


SET, GET, WAIT, ADD = 1, 2, 3, 4
put(d, "set-get", frame(bytes([SET]) + s(b"key") + s(b"value")) +
    frame(bytes([GET]) + struct.pack("<Q", 100) + s(b"key")))
put(d, "wait", frame(bytes([SET]) + s(b"a") + s(b"1")) +
    frame(bytes([WAIT]) + struct.pack("<QI", 0, 2) + s(b"a") + s(b"b")))
put(d, "add", frame(bytes([ADD]) + s(b"counter") + struct.pack("<q", 5)) +
    frame(bytes([ADD]) + s(b"counter") + struct.pack("<q", -2)))
put(d, "get-timeout", frame(bytes([GET]) + struct.pack("<Q", 1) + s(b"absent")))

# ---- the parameter server's requests ----

d = target("ps")
INIT, PULL, PUSH, STATUS = 0, 1, 2, 3


def call(method, message):
    return bytes([method]) + struct.pack("<H", len(message)) + message


def tensor(name, shape, values):
    return (field_bytes(1, name.encode()) + field_bytes(2, b"".join(varint(x) for x in shape)) +
            field_bytes(3, struct.pack("<%df" % len(values), *values)))


def optimizer(kind, lr):
    return field_bytes(1, kind.encode()) + field_float(2, lr) + field_float(7, 0.9) + \
        field_float(8, 0.999) + field_float(9, 1e-8)


w = tensor("w", [2, 2], [1, 2, 3, 4])
b = tensor("b", [2], [0, 0])
init_async = field_bytes(1, w) + field_bytes(1, b) + field_bytes(2, optimizer("sgd", 0.1))
init_sync = init_async + field_varint(3, 2)
gw = tensor("w", [2, 2], [0.1, 0.1, 0.1, 0.1])
gb = tensor("b", [2], [1, -1])
push = field_varint(1, 7) + field_float(6, 0.1) + field_bytes(7, gw) + field_bytes(7, gb)
put(d, "async", call(INIT, init_async) + call(PUSH, push) + call(PULL, b"") + call(STATUS, b""))
put(d, "sync", call(INIT, init_sync) + call(PUSH, push + field_varint(5, 0)) +
    call(PUSH, push + field_varint(5, 1)) + call(PULL, b""))
adam = field_bytes(1, w) + field_bytes(2, optimizer("adamw", 0.01)) + \
    field_bytes(5, tensor("step", [], [3.0]))
put(d, "adam-state", call(INIT, adam) + call(PULL, b""))
