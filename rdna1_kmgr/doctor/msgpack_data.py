"""MessagePack, read: the subset TheRock's kpack files use (maps, arrays, strings, binary, integers, floats,
booleans, nil), enough to read a .kpack table of contents and a .rocm_kpack_ref marker without the msgpack
package. The encoding is the public MessagePack specification (msgpack/msgpack, spec.md); extension types
are refused.
"""

from __future__ import annotations

import struct

_MAX_DEPTH = 32


class MsgpackError(ValueError):
    """The bytes are not MessagePack this reader understands."""


def decode(data: bytes, offset: int = 0):
    """The object that starts at `offset` (what follows it is ignored)."""
    value, _ = _read(memoryview(data), offset, 0)
    return value


def _read(data: memoryview, pos: int, depth: int):
    if depth > _MAX_DEPTH:
        raise MsgpackError("nested too deep")
    if pos >= len(data):
        raise MsgpackError("truncated")
    tag = data[pos]
    pos += 1
    if tag <= 0x7F:
        return tag, pos
    if tag >= 0xE0:
        return tag - 0x100, pos
    if 0x80 <= tag <= 0x8F:
        return _map(data, pos, tag & 0x0F, depth)
    if 0x90 <= tag <= 0x9F:
        return _array(data, pos, tag & 0x0F, depth)
    if 0xA0 <= tag <= 0xBF:
        return _text(data, pos, tag & 0x1F)
    fixed = {0xC0: None, 0xC2: False, 0xC3: True}
    if tag in fixed:
        return fixed[tag], pos
    sized = {
        0xC4: "B",
        0xC5: "H",
        0xC6: "I",
        0xD9: "B",
        0xDA: "H",
        0xDB: "I",
        0xDC: "H",
        0xDD: "I",
        0xDE: "H",
        0xDF: "I",
    }
    if tag in sized:
        fmt = ">" + sized[tag]
        (length,) = _unpack(fmt, data, pos)
        pos += struct.calcsize(fmt)
        if tag in (0xC4, 0xC5, 0xC6):
            return _bytes(data, pos, length)
        if tag in (0xD9, 0xDA, 0xDB):
            return _text(data, pos, length)
        if tag in (0xDC, 0xDD):
            return _array(data, pos, length, depth)
        return _map(data, pos, length, depth)
    numbers = {
        0xCA: ">f",
        0xCB: ">d",
        0xCC: ">B",
        0xCD: ">H",
        0xCE: ">I",
        0xCF: ">Q",
        0xD0: ">b",
        0xD1: ">h",
        0xD2: ">i",
        0xD3: ">q",
    }
    if tag in numbers:
        (value,) = _unpack(numbers[tag], data, pos)
        return value, pos + struct.calcsize(numbers[tag])
    raise MsgpackError(f"type 0x{tag:02x} at offset {pos - 1} is not read here")


def _unpack(fmt: str, data: memoryview, pos: int):
    if pos + struct.calcsize(fmt) > len(data):
        raise MsgpackError("truncated")
    return struct.unpack_from(fmt, data, pos)


def _bytes(data: memoryview, pos: int, length: int):
    if pos + length > len(data):
        raise MsgpackError("truncated")
    return bytes(data[pos : pos + length]), pos + length


def _text(data: memoryview, pos: int, length: int):
    raw, pos = _bytes(data, pos, length)
    return raw.decode("utf-8", "replace"), pos


def _array(data: memoryview, pos: int, count: int, depth: int):
    items = []
    for _ in range(count):
        item, pos = _read(data, pos, depth + 1)
        items.append(item)
    return items, pos


def _map(data: memoryview, pos: int, count: int, depth: int):
    result = {}
    for _ in range(count):
        key, pos = _read(data, pos, depth + 1)
        value, pos = _read(data, pos, depth + 1)
        result[key if key is None or isinstance(key, str | int | bool) else repr(key)] = value
    return result, pos
