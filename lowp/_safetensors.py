"""The safetensors container, read and written with numpy (spec §9).

Not through the `safetensors` package: its Python API for dtypes numpy lacks changed
incompatibly in 0.8 (`serialize` takes TensorSpecs with raw pointers) and
`safetensors.numpy` has no bfloat16, while the format itself is stable. Layout: an
8-byte little-endian header length N, N bytes of UTF-8 JSON, then the raw tensor bytes,
each tensor at its `data_offsets` relative to the end of the header. A file is
validated as it is read (offsets tile the data exactly, shapes match sizes), and written
atomically. lowp's own files (`_interchange`) and other tools' checkpoints
(`lowp.checkpoints`) both go through here.
"""

import contextlib
import dataclasses
import json
import math
import os
import re
import reprlib
import struct
import time
import types
import uuid
from typing import TypeGuard

import ml_dtypes
import numpy as np

from lowp import _qtensor

# POSIX: a writer locks its temporary file, so a later save can tell a stale one.
fcntl: types.ModuleType | None
try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

# The safetensors dtype names lowp reads and writes, and the numpy dtype of each.
DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype(np.bool_),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}
# The most dims a stored tensor may have: numpy 1's limit (numpy 2 allows 64), so a file
# reads alike under both, and a reshape never fails with "maximum supported dimension".
MAX_RANK = 32


def plain_array(name: str, array: np.ndarray) -> np.ndarray:
    """`array` as a C-contiguous little-endian array of a safetensors dtype."""
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    if array.dtype not in DTYPE_NAMES:
        raise TypeError(
            f"tensor {show(name)}: dtype {array.dtype} cannot be stored; safetensors dtypes lowp "
            f"writes: {', '.join(str(d) for d in DTYPE_NAMES)}"
        )
    # Not np.ascontiguousarray: it turns 0-d arrays into shape (1,).
    return array if array.flags.c_contiguous else array.copy(order="C")


def write(path, arrays: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    names = sorted(arrays)
    header: dict[str, object] = {"__metadata__": metadata}
    begin = 0
    for name in names:
        array = arrays[name]
        end = begin + array.nbytes
        header[name] = {
            "dtype": DTYPE_NAMES[array.dtype],
            "shape": list(array.shape),
            "data_offsets": [begin, end],
        }
        begin = end
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * (-len(header_bytes) % 8)  # as safetensors pads: data starts 8-aligned
    chunks: list[bytes | np.ndarray] = [struct.pack("<Q", len(header_bytes)), header_bytes]
    chunks += [arrays[name].reshape(-1).view(np.uint8) for name in names]
    atomic_write(path, chunks)


def atomic_write(path, chunks) -> None:
    path = os.fspath(path)
    directory, base = os.path.split(path)
    tmp = os.path.join(directory, f".{base}.{uuid.uuid4().hex}.tmp")
    # os.open with 0o666 rather than tempfile: the file gets the umask's usual mode, not 0600.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            if fcntl is not None:  # held until closed: this writer is alive
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            _remove_stale_temporaries(directory, base, tmp)
            for chunk in chunks:
                f.write(memoryview(chunk))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


# A temporary file is stale when no writer holds its lock and it has not been written to
# for this long (the age covers the instant between a writer's create and its lock). Where
# there are no locks (Windows), age alone decides, over a day.
_STALE_AFTER_S = 60.0
_STALE_UNLOCKED_AFTER_S = 86400.0


def _remove_stale_temporaries(directory: str, base: str, own: str) -> None:
    """Delete the temporary files earlier `save`s of this target left when killed (the
    original file survives a killed save; the half-written copy beside it did too)."""
    pattern = re.compile(rf"\.{re.escape(base)}\.[0-9a-f]{{32}}\.tmp")
    with contextlib.suppress(OSError):
        names = os.listdir(directory or ".")
        for name in names:
            candidate = os.path.join(directory, name)
            if not pattern.fullmatch(name) or os.path.abspath(candidate) == os.path.abspath(own):
                continue
            with contextlib.suppress(OSError):
                _remove_if_stale(candidate)


def _remove_if_stale(candidate: str) -> None:
    age = time.time() - os.stat(candidate).st_mtime
    if fcntl is None:
        if age > _STALE_UNLOCKED_AFTER_S:
            os.unlink(candidate)
        return
    if age <= _STALE_AFTER_S:
        return
    with open(candidate, "rb") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a writer still inside save holds it
            return
        os.unlink(candidate)


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    begin: int
    end: int


def read(path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(name -> array sorted by name, __metadata__) of a validated safetensors file."""
    with open_file(path) as f:
        size = os.fstat(f.fileno()).st_size
        header, data_start = read_header(f, size, path)
        metadata = parse_metadata(header.pop("__metadata__", {}), path)
        entries = [parse_entry(name, info, path) for name, info in sorted(header.items())]
        check_empty_spans([e.shape for e in entries], path)
        check_offsets(entries, size - data_start, path)
        arrays = {e.name: read_tensor(f, data_start, e, path) for e in entries}
    return arrays, metadata


def read_header(f, size: int, path) -> tuple[dict, int]:
    if size < 8:
        raise error(
            path, f"too short for a safetensors file: {size} bytes, under the 8-byte header length"
        )
    (n,) = struct.unpack("<Q", _read_exactly(f, 8, path))
    if n > size - 8:
        raise error(
            path,
            f"header length {n} runs past the end of the file ({size} bytes): truncated, "
            "or not a safetensors file",
        )
    text = _read_exactly(f, n, path)
    try:
        header = parse_json(text.decode("utf-8"))
    except ValueError as e:  # not UTF-8, not JSON, nested too deeply, ints too long
        raise error(path, f"header is not valid UTF-8 JSON: {e}") from e
    if not isinstance(header, dict):
        raise error(path, f"header must be a JSON object, got {type(header).__name__}")
    return header, 8 + n


def parse_metadata(metadata, path) -> dict[str, str]:
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise error(path, "__metadata__ must map strings to strings")
    return metadata


def parse_entry(name: str, info, path) -> Entry:
    where = f"tensor {show(name)}"
    if not isinstance(info, dict):
        raise error(path, f"{where}: header entry must be an object, got {show(info)}")
    check_keys(info, ("dtype", "shape", "data_offsets"), where, path)
    dtype_name, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype_name, str) or dtype_name not in DTYPES:
        raise error(
            path, f"{where}: unknown dtype {show(dtype_name)}; lowp reads {', '.join(DTYPES)}"
        )
    if not isinstance(shape, list) or not all(is_int(n) and n >= 0 for n in shape):
        raise error(path, f"{where}: shape must be a list of non-negative ints, got {show(shape)}")
    if len(shape) > MAX_RANK:
        raise error(path, f"{where}: rank {len(shape)} is over the {MAX_RANK} dims lowp reads")
    if (problem := _qtensor.empty_span_problem(shape)) is not None:
        raise error(path, f"{where}: {problem}")
    pair = isinstance(offsets, list) and len(offsets) == 2
    if not pair or not all(is_int(o) and o >= 0 for o in offsets) or offsets[0] > offsets[1]:
        raise error(
            path, f"{where}: data_offsets must be ints 0 <= begin <= end, got {show(offsets)}"
        )
    begin, end = offsets
    dtype = DTYPES[dtype_name]
    nbytes = math.prod(shape) * dtype.itemsize
    if end - begin != nbytes:
        raise error(
            path,
            f"{where}: shape {shape} of {dtype_name} is {nbytes} bytes but data_offsets "
            f"{offsets} hold {end - begin}",
        )
    return Entry(name, dtype, tuple(shape), begin, end)


def check_offsets(entries: list[Entry], data_size: int, path) -> None:
    """The tensors must tile the data section exactly: no overlap, gap or trailing bytes."""
    position, previous = 0, None
    for e in sorted(entries, key=lambda e: (e.begin, e.end)):
        if e.begin < position:
            raise error(
                path,
                f"tensor {show(e.name)}: data_offsets [{e.begin}, {e.end}] overlap {show(previous)}'s",
            )
        if e.begin > position:
            raise error(
                path,
                f"tensor {show(e.name)}: data_offsets [{e.begin}, {e.end}] leave a gap after byte "
                f"{position}; safetensors offsets must be contiguous",
            )
        if e.end > data_size:
            raise error(
                path,
                f"tensor {show(e.name)}: data_offsets [{e.begin}, {e.end}] out of bounds: the data "
                f"section has {data_size} bytes (truncated file?)",
            )
        position, previous = e.end, e.name
    if position != data_size:
        raise error(path, f"trailing garbage: {data_size - position} bytes after the last tensor")


def check_empty_spans(shapes, path) -> None:
    """Empty tensors may not together span more than one may (`_qtensor.MAX_EMPTY_SPAN`):
    each costs work in proportion to its span, and a header holds thousands."""
    total = sum(_qtensor.empty_span(shape) for shape in shapes)
    if total > _qtensor.MAX_EMPTY_SPAN:
        raise error(
            path,
            f"its empty tensors span {total} together, over the {_qtensor.MAX_EMPTY_SPAN} "
            "lowp allows (a corrupt or hostile header?)",
        )


def read_tensor(f, data_start: int, e: Entry, path) -> np.ndarray:
    # One read into a fresh buffer: the array owns aligned memory and outlives the file.
    buffer = np.empty(e.end - e.begin, np.uint8)
    f.seek(data_start + e.begin)
    # numpy's stubs declare ndarray.__buffer__ only for Python >= 3.12; 3.11 has the C protocol.
    view, filled = memoryview(buffer), 0  # type: ignore[arg-type]
    while filled < len(buffer):
        n = f.readinto(view[filled:])
        if not n:
            raise error(
                path, f"tensor {show(e.name)}: the file ended early (changed while loading?)"
            )
        filled += n
    return buffer.view(e.dtype).reshape(e.shape)


# --- Helpers ---


class FileEnded(ValueError):
    """The file held fewer bytes than its size said: another process is changing it."""


def open_file(path):
    try:
        return open(path, "rb")
    except IsADirectoryError:
        raise error(path, "a directory, not a safetensors file") from None


def _read_exactly(f, n: int, path) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise FileEnded(str(error(path, "the file ended early (changed while loading?)")))
    return data


def parse_json(text: str):
    """json.loads refusing duplicate keys; a document nested too deeply for the parser
    (a RecursionError) is a ValueError like any other invalid JSON."""
    try:
        return json.loads(text, object_pairs_hook=_refuse_duplicate_keys)
    except RecursionError:
        raise ValueError("nested too deeply") from None


# Error messages show what a file holds cut short: a 30 MB field name stays out of them.
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 120
_REPR.maxlist = _REPR.maxdict = 16
_REPR.maxlevel = 3
_REPR.maxlong = 60
_MAX_MESSAGE = 900


def show(value: object) -> str:
    """repr(value) for an error message, cut to a readable length and depth."""
    return _REPR.repr(value)


def error(path, message: str) -> ValueError:
    message = f"{os.fspath(path)}: {message}"
    if len(message) > _MAX_MESSAGE:
        half = _MAX_MESSAGE // 2
        message = (
            f"{message[:half]} [... {len(message) - 2 * half} characters cut ...] {message[-half:]}"
        )
    return ValueError(message)


def is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def check_keys(doc: dict, expected, where: str, path, optional=()) -> None:
    missing = [k for k in expected if k not in doc]
    if missing:
        raise error(path, f"{where}: missing field {show(missing[0])}")
    unknown = sorted(set(doc) - set(expected) - set(optional))
    if unknown:  # an unknown field may change the meaning; refuse rather than guess
        raise error(path, f"{where}: unknown field {show(unknown[0])}")


def _refuse_duplicate_keys(pairs: list) -> dict:
    doc = dict(pairs)
    if len(doc) != len(pairs):  # json.loads would keep the last silently
        seen = set()
        for key, _ in pairs:  # the first key to repeat
            if key in seen:
                raise ValueError(f"duplicate key {show(key)}")
            seen.add(key)
    return doc
