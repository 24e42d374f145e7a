#!/usr/bin/python3
"""An independent reader of TensorBoard event files, for tests/cli/tensorboard_test.cpp: parses the
TFRecord framing itself (both masked CRC32Cs checked, with a CRC-32C of its own) and decodes each
record as tensorflow's `Event` with Debian's python3-protobuf, from a descriptor built here with the
field numbers of tensorflow/core/util/event.proto and framework/summary.proto.

usage: tensorboard_reader.py EVENTS_FILE -> JSON: {"file_version": ..., "scalars": [[step, tag,
value], ...]}; exits 1 naming the byte offset of a bad record.
"""
import json, struct, sys

from google.protobuf import descriptor_pb2, descriptor_pool
try:
    from google.protobuf import message_factory
    _get = lambda pool, d: message_factory.GetMessageClass(d)  # protobuf >= 4
    message_factory.GetMessageClass  # noqa: B018
except AttributeError:
    _get = lambda pool, d: message_factory.MessageFactory(pool).GetPrototype(d)

_TABLE = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    _TABLE.append(c)


def masked_crc(data):
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    c ^= 0xFFFFFFFF
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def event_class():
    f = descriptor_pb2.FileDescriptorProto(name="hpm_test_event.proto", package="tbtest")
    T = descriptor_pb2.FieldDescriptorProto
    value = f.message_type.add(name="Value")
    value.field.add(name="tag", number=1, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)
    value.field.add(name="simple_value", number=2, type=T.TYPE_FLOAT, label=T.LABEL_OPTIONAL)
    summary = f.message_type.add(name="Summary")
    summary.field.add(name="value", number=1, type=T.TYPE_MESSAGE, label=T.LABEL_REPEATED,
                      type_name=".tbtest.Value")
    event = f.message_type.add(name="Event")
    event.field.add(name="wall_time", number=1, type=T.TYPE_DOUBLE, label=T.LABEL_OPTIONAL)
    event.field.add(name="step", number=2, type=T.TYPE_INT64, label=T.LABEL_OPTIONAL)
    event.field.add(name="file_version", number=3, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)
    event.field.add(name="summary", number=5, type=T.TYPE_MESSAGE, label=T.LABEL_OPTIONAL,
                    type_name=".tbtest.Summary")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return _get(pool, pool.FindMessageTypeByName("tbtest.Event"))


def main():
    data = open(sys.argv[1], "rb").read()
    Event = event_class()
    out = {"file_version": None, "scalars": [], "wall_times": []}
    at = 0
    while at < len(data):
        if at + 12 > len(data):
            sys.exit(f"truncated header at byte {at}")
        (n,) = struct.unpack("<Q", data[at:at + 8])
        (len_crc,) = struct.unpack("<I", data[at + 8:at + 12])
        if masked_crc(data[at:at + 8]) != len_crc:
            sys.exit(f"length CRC mismatch at byte {at}")
        body = data[at + 12:at + 12 + n]
        (data_crc,) = struct.unpack("<I", data[at + 12 + n:at + 16 + n])
        if len(body) != n or masked_crc(body) != data_crc:
            sys.exit(f"data CRC mismatch at byte {at}")
        e = Event()
        e.ParseFromString(body)
        out["wall_times"].append(e.wall_time)
        if e.file_version:
            out["file_version"] = e.file_version
        for v in e.summary.value:
            out["scalars"].append([e.step, v.tag, v.simple_value])
        at += 16 + n
    print(json.dumps(out))


if __name__ == "__main__":
    main()
