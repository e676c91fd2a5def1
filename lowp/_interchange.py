"""Saving and loading QTensors and arrays as safetensors files (spec §9).

The safetensors container is read and written here with numpy rather than through the
`safetensors` package: that package's Python API for dtypes numpy lacks changed
incompatibly in 0.8 (`serialize` takes TensorSpecs with raw pointers) and
`safetensors.numpy` has no bfloat16, while the format itself is stable. Layout: an
8-byte little-endian header length N, N bytes of UTF-8 JSON, then the raw tensor bytes,
each tensor at its `data_offsets` relative to the end of the header.

A QTensor `NAME` becomes the tensors `NAME.codes`, `NAME.scale` and (NVFP4 with a global
scale) `NAME.global_scale`, with its scheme, shape, hp_dtype and scale layout as JSON under
the header's `__metadata__` key `lowp`; optionally (lowp_format 2) also the scheme its layer
quantizes inputs with at run time, its "activation". Byte order is little-endian on disk;
lowp assumes a little-endian host, as numpy's float8/bfloat16 dtypes in ml_dtypes do.
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
import zipfile
import zlib
from collections.abc import Mapping
from typing import TypeGuard

import ml_dtypes
import numpy as np

from lowp import _qtensor, _schemes

# POSIX: a writer locks its temporary file, so a later save can tell a stale one.
fcntl: types.ModuleType | None
try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

# The newest lowp_format this lowp reads. 2 = 1 plus the optional entry field "activation";
# 3 = 2 plus the checksums ("checksums", "tensors_checksum"), which `save` writes unless
# told not to; without them it writes 1, or 2 when it records an activation.
LOWP_FORMAT = 3
_CHECKSUMS_FORMAT = 3
METADATA_KEY = "lowp"
_CHECKSUM = re.compile(r"crc32:[0-9a-f]{8}")

# The safetensors dtype names lowp reads and writes, and the numpy dtype of each.
_DTYPES = {
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
_DTYPE_NAMES = {dtype: name for name, dtype in _DTYPES.items()}
# The most dims a stored tensor may have: numpy 1's limit (numpy 2 allows 64), so a file
# reads alike under both, and a reshape never fails with "maximum supported dimension".
MAX_RANK = 32

# Each scheme kind's JSON fields and their JSON types, from the schemes' own codec
# (`Scaling.json_types`, `to_fields`, `from_fields`): the object a file holds for a scheme
# is {"kind": its class name, then every dataclass field in order}, so a new field or a
# new scheme is saved and read without a line here.
SCHEME_FIELDS = {t.__name__: (t, t.json_types()) for t in _schemes.SCHEME_TYPES}
# The scheme kinds with an `axis` field, which a file stores non-negative (spec §9).
_AXIS_SCHEMES = _schemes.AXIS_SCHEME_TYPES
_ENTRY_FIELDS = ("scheme", "shape", "hp_dtype", "scale_layout")
_ACTIVATION = "activation"  # optional entry field, lowp_format >= 2
# An activation has no rank until run time; the GEMM reads it as x (M, K) quantized along
# K (spec §8), so its axis is stored as that rank-2 operand's: 1.
_ACTIVATION_RANK = 2


def save(
    path: str | os.PathLike,
    tensors: Mapping[str, "_qtensor.QTensor | np.ndarray"],
    *,
    activations: "Mapping[str, _schemes.Scheme | None] | None" = None,
    checksums: bool = True,
):
    """Write QTensors and plain arrays to one safetensors file, atomically.

    Args:
      path: the file to write; replaced in one step (temporary file + os.replace), so a
        reader never sees half a file.
      tensors: name -> QTensor, or name -> numpy array of a safetensors dtype (float64,
        float32, float16, bfloat16, float8_e4m3fn, float8_e5m2, float8_e8m0fnu, signed and
        unsigned 8- to 64-bit ints, bool), of any shape including 0-d and empty.
      activations: QTensor name -> the scheme that layer quantizes its input with at run
        time (an `InferenceConfig.activation`), or None for weight-only; recorded in the
        entry (read back with `load_activations`). Names left out record nothing. An
        activation is quantized along K, its last axis: a scheme with an axis must say -1.
      checksums: record a CRC-32 of each stored tensor (its dtype, shape and bytes) and of
        the QTensor entries, which `load` verifies (lowp_format 3). False writes the file
        an older lowp reads (lowp_format 1 or 2), unprotected.

    Raises:
      TypeError: a value that is neither a QTensor nor a numpy array of a supported dtype,
        or an activation that is not a scheme or None.
      ValueError: a non-str name, two names that would be stored under one tensor name
        (a plain `w.codes` next to QTensor `w`), an activation for a name that is not a
        QTensor here, or an activation axis other than -1.

    >>> import os, tempfile, lowp
    >>> q = lowp.quantize(np.ones((2, 32), np.float32), lowp.MXScaling())
    >>> path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
    >>> save(path, {"w": q, "b": np.zeros(2, np.float32)})
    >>> loaded = load(path)
    >>> sorted(loaded), loaded["w"].scheme
    (['b', 'w'], MXScaling(fmt='float8_e4m3fn', block=32, mode='floor', axis=-1))
    """
    arrays, entries = _flatten(tensors)
    _record_activations(entries, {} if activations is None else activations)
    # The lowest version that holds the file: without activations, what older lowp reads.
    version = 2 if any(_ACTIVATION in e for e in entries.values()) else 1
    doc: dict[str, object] = {"lowp_format": version, "tensors": entries}
    if checksums:
        doc["lowp_format"] = _CHECKSUMS_FORMAT
        doc["checksums"] = {name: _checksum(array) for name, array in arrays.items()}
        doc["tensors_checksum"] = _entries_checksum(entries)
    # Sorted keys: the same tensors make the same file, whichever framework wrote them.
    lowp_json = json.dumps(doc, separators=(",", ":"), sort_keys=True)
    _write_safetensors(path, arrays, {METADATA_KEY: lowp_json})


def load(
    path: str | os.PathLike, *, verify: bool = True
) -> dict[str, "_qtensor.QTensor | np.ndarray"]:
    """Read a safetensors file written by `save` (or by anything else) into memory.

    A checkpoint directory (config.json + safetensors shards) or a file of another tool's
    checkpoint dialect (HF fp8, compressed-tensors, ModelOpt, gpt-oss, torchao) is read by
    `lowp.checkpoints.load_checkpoint`: its quantized tensors come back as QTensors whose
    `origin` names the dialect (docs/checkpoints.md).

    A file without lowp's metadata loads as plain arrays (a Hugging Face checkpoint, say).
    With it, each QTensor entry is rebuilt from its `.codes`/`.scale`/`.global_scale`
    tensors. The file stores the scheme's axis non-negative (spec §9); it comes back
    counted from the end, as lowp's presets spell it: a rank-2 tensor saved with
    `MXScaling(axis=1)` or `MXScaling(axis=-1)` loads with `MXScaling(axis=-1)`.

    A file with checksums (lowp_format 3, what `save` writes) has each tensor's dtype,
    shape and bytes checked against its CRC-32, and the QTensor entries against theirs;
    `verify=False` skips the tensors' (one more pass over the data, CRC-32 at about
    0.8 GB/s a core: docs/numerics.md §9). Files without checksums load as before.

    Returns:
      name -> QTensor or numpy array, sorted by name; arrays are fresh in-memory copies.

    Raises:
      ValueError: naming the file and the problem, for a corrupt container, a file from a
        newer lowp, a QTensor entry that is malformed or disagrees with its arrays, or
        (naming the tensor) bytes, a dtype or a shape other than those saved.
    """
    from lowp import checkpoints  # another tool's checkpoint (a directory, a foreign file)

    if checkpoints.is_checkpoint(path):
        return checkpoints.load_checkpoint(path, verify=verify)
    arrays, metadata = _read_safetensors(path)
    if METADATA_KEY not in metadata:
        return dict(arrays)
    version, entries, checksums = _parse_lowp_metadata(metadata[METADATA_KEY], path)
    if checksums is not None:
        _check_checksums(arrays, checksums, path, verify)
    # Components first, then clashes: QTensors `w` and `w.codes` may share a file
    # (stored as w.codes, w.codes.codes, ...), but a plain `w` beside QTensor `w` may not.
    loaded: dict[str, _qtensor.QTensor | np.ndarray] = {}
    for name, entry in entries.items():
        _entry_activation(name, entry, version, path)  # a bad activation fails load too
        loaded[name] = _qtensor_from_entry(name, entry, arrays, path)
    clashes = sorted(set(loaded) & set(arrays))
    if clashes:
        raise _error(path, f"tensor {_show(clashes[0])} is both a plain tensor and a QTensor entry")
    loaded.update(arrays)  # what no QTensor claimed stays a plain array
    return dict(sorted(loaded.items()))


def load_activations(path: str | os.PathLike) -> "dict[str, _schemes.Scheme | None]":
    """The activation scheme recorded for each QTensor of a lowp file, reading only its header.

    Returns:
      QTensor name -> the scheme its layer quantizes inputs with at run time (axis
      counted from the end, -1), or None where the file records weight-only. A QTensor
      the file records nothing for (a file from before lowp_format 2, or saved without
      `activations=`) is absent, as is every name of a file without lowp metadata.

    Raises:
      ValueError: naming the file and the tensor, for a malformed activation field or
        a lowp metadata version it does not read. The rest of each tensor's entry
        (its own scheme, shape, dtype, layout) is `load`'s to check, with the data.

    >>> import os, tempfile, lowp
    >>> q = lowp.quantize(np.ones((2, 32), np.float32), lowp.MXScaling())
    >>> path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
    >>> save(path, {"w": q, "v": q, "u": q}, activations={"w": lowp.MXScaling(), "v": None})
    >>> load_activations(path)
    {'v': None, 'w': MXScaling(fmt='float8_e4m3fn', block=32, mode='floor', axis=-1)}
    """
    from lowp import checkpoints  # a checkpoint directory, another tool's file

    if checkpoints.is_checkpoint(path):
        return checkpoints.checkpoint_activations(path)
    with _open(path) as f:
        header, _ = _read_header(f, os.fstat(f.fileno()).st_size, path)
    metadata = _parse_metadata(header.get("__metadata__", {}), path)
    if METADATA_KEY not in metadata:
        return {}
    version, entries, _ = _parse_lowp_metadata(metadata[METADATA_KEY], path)
    recorded = {}
    for name, entry in sorted(entries.items()):
        activation = _entry_activation(name, entry, version, path)
        if activation is not _NOT_RECORDED:
            recorded[name] = activation
    return recorded


def read_arrays(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Plain numpy arrays from a `.safetensors` or `.npz` file, by its suffix.

    QTensors are not rebuilt: a lowp file gives its `NAME.codes`, `NAME.scale`, ...
    arrays. `.npz` files load without pickle, so object arrays are refused.
    """
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    if suffix == ".safetensors":
        return _read_safetensors(path)[0]
    if suffix == ".npz":
        if not zipfile.is_zipfile(path):  # else numpy guesses "pickled data" and says so
            raise _error(path, "not a .npz file (an .npz is a zip archive of .npy files)")
        try:
            with np.load(path, allow_pickle=False) as archive:
                arrays = {name: archive[name] for name in archive.files}
        except (ValueError, OSError, zipfile.BadZipFile) as err:
            raise _error(path, f"unreadable .npz: {err}") from err
        for name, array in arrays.items():
            if (problem := _qtensor.empty_span_problem(array.shape)) is not None:
                raise _error(path, f"tensor {_show(name)}: {problem}")
        _check_empty_spans([a.shape for a in arrays.values()], path)
        return arrays
    raise _error(path, f"expected a .safetensors or .npz file, got suffix {_show(suffix)}")


# --- QTensors <-> named arrays and lowp metadata ---


def _flatten(tensors) -> tuple[dict[str, np.ndarray], dict[str, dict]]:
    """The arrays to store under each name, and the metadata entry of each QTensor."""
    if not isinstance(tensors, Mapping):
        raise TypeError(f"save takes a dict name -> QTensor or array, got {type(tensors).__name__}")
    arrays: dict[str, np.ndarray] = {}
    owners: dict[str, str] = {}  # stored name -> the tensor that stores it
    entries: dict[str, dict] = {}
    for name, value in tensors.items():
        if not isinstance(name, str):  # a ValueError, as save's docstring says
            raise ValueError(f"tensor names must be str, got {_show(name)} ({type(name).__name__})")  # noqa: TRY004
        if isinstance(value, _qtensor.QTensor):
            parts, entries[name] = _qtensor_parts(name, value)
        elif isinstance(value, np.ndarray):
            parts = {name: _plain_array(name, value)}
        else:
            raise TypeError(
                f"tensor {_show(name)}: expected a QTensor or numpy array, got {type(value).__name__}"
            )
        for stored, array in parts.items():
            if stored == "__metadata__":
                raise ValueError(
                    f"tensor name {_show(name)}: '__metadata__' is reserved by safetensors"
                )
            if stored in owners:
                raise ValueError(
                    f"tensors {_show(owners[stored])} and {_show(name)} would both be stored as {_show(stored)}"
                )
            owners[stored], arrays[stored] = name, array
    return arrays, entries


def _qtensor_parts(name: str, q: "_qtensor.QTensor") -> tuple[dict[str, np.ndarray], dict]:
    from lowp.checkpoints import _dequantize  # the checkpoints package imports this module

    _dequantize.refuse_origin(q, f"save: tensor {_show(name)}", "lowp.dequantize(q)")
    try:  # rebuild to re-run the checks: arrays are mutable and may have been reshaped since
        q = dataclasses.replace(q)
    except (TypeError, ValueError) as e:
        raise type(e)(f"tensor {_show(name)}: {e}") from e
    parts = {f"{name}.codes": q.codes, f"{name}.scale": q.scale}
    if q.global_scale is not None:
        parts[f"{name}.global_scale"] = q.global_scale
    entry = {
        "scheme": _scheme_to_json(q.scheme, len(q.shape)),
        "shape": list(q.shape),
        "hp_dtype": q.hp_dtype,
        "scale_layout": q.scale_layout,
    }
    return {stored: _plain_array(stored, a) for stored, a in parts.items()}, entry


def _record_activations(entries: dict[str, dict], activations) -> None:
    """Add each QTensor's "activation" field (a scheme's JSON, or None) to its entry."""
    if not isinstance(activations, Mapping):
        raise TypeError(
            f"activations must be a dict name -> Scheme or None, got {_show(activations)}"
        )
    for name, scheme in activations.items():
        if name not in entries:
            raise ValueError(f"activations[{_show(name)}]: no QTensor of that name is being saved")
        if scheme is None:
            entries[name][_ACTIVATION] = None
            continue
        if getattr(scheme, "axis", -1) != -1:  # -1 is the only axis meaning K at every rank
            raise ValueError(
                f"activations[{_show(name)}] = {scheme}: an activation is quantized along K, its "
                "last axis (spec §8): spell it axis=-1"
            )
        try:
            entries[name][_ACTIVATION] = _scheme_to_json(scheme, _ACTIVATION_RANK)
        except TypeError as e:
            raise TypeError(f"activations[{_show(name)}]: {e}") from e


def _scheme_to_json(scheme: _schemes.Scheme, rank: int) -> dict:
    scheme_type, _ = SCHEME_FIELDS.get(type(scheme).__name__, (None, {}))
    if type(scheme) is not scheme_type:  # a subclass could carry fields we would drop
        raise TypeError(f"cannot save {scheme!r}: lowp files hold {tuple(SCHEME_FIELDS)} only")
    return scheme.to_fields(rank)  # spec §9: an axis stored normalised


def _parse_lowp_metadata(text: str, path) -> tuple[int, dict, dict | None]:
    """The lowp_format, `tensors` map and `checksums` map (None before lowp_format 3) of
    lowp's metadata, after checking their shape and the entries' checksum."""
    try:
        doc = _json(text)
    except ValueError as e:
        raise _error(path, f"the {METADATA_KEY!r} metadata is not valid JSON: {e}") from e
    if not isinstance(doc, dict):
        raise _error(path, f"the {METADATA_KEY!r} metadata must be a JSON object")
    version = doc.get("lowp_format")
    if not _is_int(version):
        raise _error(
            path, f"the {METADATA_KEY!r} metadata needs an int lowp_format: {_show(version)}"
        )
    if version > LOWP_FORMAT:
        raise _error(
            path,
            f"written by a newer lowp (lowp_format {version}); this lowp reads lowp_format "
            f"{LOWP_FORMAT}: upgrade lowp",
        )
    if version < 1:
        raise _error(path, f"unknown lowp_format {version}")
    where = f"the {METADATA_KEY!r} metadata"
    fields: tuple[str, ...] = ("lowp_format", "tensors")
    if version >= _CHECKSUMS_FORMAT:
        fields += ("checksums", "tensors_checksum")
    _check_keys(doc, fields, where, path)
    if not isinstance(doc["tensors"], dict):
        raise _error(path, f"{where}: field 'tensors' must be an object")
    if version < _CHECKSUMS_FORMAT:
        return version, doc["tensors"], None
    if not isinstance(doc["checksums"], dict):
        raise _error(path, f"{where}: field 'checksums' must be an object")
    for name, value in [("the tensors", doc["tensors_checksum"]), *doc["checksums"].items()]:
        if not isinstance(value, str) or not _CHECKSUM.fullmatch(value):
            raise _error(
                path,
                f"{where}: checksum of {_show(name)} must be 'crc32:' and 8 hex digits, "
                f"got {_show(value)}",
            )
    if _entries_checksum(doc["tensors"]) != doc["tensors_checksum"]:
        raise _error(
            path,
            f"{where}'s tensors changed since the file was saved: their checksum "
            f"{_entries_checksum(doc['tensors'])} is not the {doc['tensors_checksum']} recorded",
        )
    return version, doc["tensors"], doc["checksums"]


def _checksum(array: np.ndarray) -> str:
    """CRC-32 of a stored tensor's dtype name, shape and bytes: a byte, dtype or shape
    changed to another legal one (which safetensors would load) changes it."""
    crc = zlib.crc32(f"{_DTYPE_NAMES[array.dtype]}{list(array.shape)}".encode())
    # numpy's stubs declare the buffer protocol only for Python >= 3.12 (as _read_tensor).
    crc = zlib.crc32(array.reshape(-1).view(np.uint8), crc)  # type: ignore[arg-type]
    return f"crc32:{crc:08x}"


def _entries_checksum(entries: dict) -> str:
    """CRC-32 of the QTensor entries as canonical JSON (sorted keys, compact)."""
    text = json.dumps(entries, separators=(",", ":"), sort_keys=True)
    return f"crc32:{zlib.crc32(text.encode()):08x}"


def _check_checksums(arrays: dict, checksums: dict, path, verify: bool) -> None:
    """Every stored tensor has a checksum and no checksum names another; with `verify`,
    each tensor's matches."""
    for name in arrays:
        if name not in checksums:
            raise _error(path, f"tensor {_show(name)} has no checksum in a checksummed file")
    for name in checksums:
        if name not in arrays:
            raise _error(path, f"a checksum for {_show(name)}, a tensor the file does not hold")
    if not verify:
        return
    for name, array in arrays.items():
        if _checksum(array) != checksums[name]:
            raise _error(
                path,
                f"tensor {_show(name)}: its bytes, dtype or shape changed since it was saved "
                f"({_checksum(array)}, the file records {checksums[name]})",
            )


_NOT_RECORDED = object()


def _entry_activation(name: str, entry, version: int, path):
    """Check entry `name`'s fields; its activation scheme, None, or _NOT_RECORDED."""
    where = f"QTensor {_show(name)}"
    if not isinstance(entry, dict):
        raise _error(path, f"{where}: metadata entry must be an object, got {_show(entry)}")
    optional = (_ACTIVATION,) if version >= 2 else ()  # in a version-1 file: unknown
    _check_keys(entry, _ENTRY_FIELDS, where, path, optional)
    if _ACTIVATION not in entry:
        return _NOT_RECORDED
    doc = entry[_ACTIVATION]
    if doc is None:
        return None
    if not isinstance(doc, dict):
        raise _error(
            path, f"{where}: field 'activation' must be a scheme object or null, got {_show(doc)}"
        )
    scheme = _scheme_from_json(doc, f"{where} activation", path)
    if not isinstance(scheme, _AXIS_SCHEMES):
        return scheme
    if scheme.axis != _ACTIVATION_RANK - 1:
        raise _error(
            path,
            f"{where} activation: axis {scheme.axis} is not K: an activation (M, K) is "
            f"quantized along its last axis, stored as {_ACTIVATION_RANK - 1} (spec §9)",
        )
    return dataclasses.replace(scheme, axis=-1)


def _qtensor_from_entry(name: str, entry, arrays: dict, path) -> "_qtensor.QTensor":
    """Rebuild QTensor `name` (entry checked by `_entry_activation`), taking its component
    arrays out of `arrays`."""
    where = f"QTensor {_show(name)}"
    scheme = _scheme_from_json(entry["scheme"], where, path)
    shape = entry["shape"]
    if not isinstance(shape, list) or not all(_is_int(n) and n >= 0 for n in shape):
        raise _error(
            path, f"{where}: field 'shape' must be a list of ints >= 0, got {_show(shape)}"
        )
    for field in ("hp_dtype", "scale_layout"):
        if not isinstance(entry[field], str):
            raise _error(
                path, f"{where}: field {_show(field)} must be a string, got {_show(entry[field])}"
            )
    if isinstance(scheme, _AXIS_SCHEMES):
        # On disk the axis is non-negative (spec §9); in memory lowp spells axes from the
        # end, as its presets and recipes do, so a loaded MXScaling equals MXScaling().
        if scheme.axis >= len(shape):
            raise _error(
                path, f"{where}: scheme axis {scheme.axis} is out of range for shape {shape}"
            )
        scheme = dataclasses.replace(scheme, axis=scheme.axis - len(shape))
    codes = _take(arrays, name, "codes", path)
    scale = _take(arrays, name, "scale", path)
    wants_global = scheme.family == "nvfp4" and scheme.global_scale  # type: ignore[union-attr]
    # A global_scale the scheme has no use for is passed on so that QTensor refuses it.
    if wants_global:
        global_scale = _take(arrays, name, "global_scale", path)
    else:
        global_scale = arrays.pop(f"{name}.global_scale", None)
    try:
        return _qtensor.QTensor(
            codes=codes,
            scale=scale,
            global_scale=global_scale,
            scheme=scheme,
            shape=tuple(shape),
            hp_dtype=entry["hp_dtype"],
            scale_layout=entry["scale_layout"],
        )
    except (TypeError, ValueError) as e:
        raise _error(path, f"{where} does not match its arrays: {e}") from e


def _scheme_from_json(doc, where: str, path) -> _schemes.Scheme:
    if not isinstance(doc, dict):
        raise _error(path, f"{where}: field 'scheme' must be an object, got {_show(doc)}")
    kind = doc.get("kind")
    if not isinstance(kind, str) or kind not in SCHEME_FIELDS:
        raise _error(
            path,
            f"{where}: unknown scheme kind {_show(kind)}; expected one of {tuple(SCHEME_FIELDS)}",
        )
    _, fields = SCHEME_FIELDS[kind]
    _check_keys(doc, ("kind", *fields), f"{where} scheme", path)
    for field, json_type in fields.items():
        value = doc[field]
        right_type = _is_int(value) if json_type is int else isinstance(value, json_type)
        if not right_type:
            raise _error(
                path,
                f"{where}: scheme field {_show(field)} must be {json_type.__name__}, got {_show(value)}",
            )
    if "axis" in fields and doc["axis"] < 0:
        raise _error(
            path,
            f"{where}: scheme field 'axis' must be stored normalised, >= 0 (spec §9), got "
            f"{doc['axis']}",
        )
    try:
        return _schemes.from_fields(doc)
    except (TypeError, ValueError) as e:
        raise _error(path, f"{where}: invalid scheme: {e}") from e


def _take(arrays: dict, name: str, part: str, path) -> np.ndarray:
    stored = f"{name}.{part}"
    if stored not in arrays:
        raise _error(path, f"QTensor {_show(name)}: missing tensor {_show(stored)}")
    return arrays.pop(stored)


# --- The safetensors container ---


def _plain_array(name: str, array: np.ndarray) -> np.ndarray:
    """`array` as a C-contiguous little-endian array of a safetensors dtype."""
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    if array.dtype not in _DTYPE_NAMES:
        raise TypeError(
            f"tensor {_show(name)}: dtype {array.dtype} cannot be stored; safetensors dtypes lowp "
            f"writes: {', '.join(str(d) for d in _DTYPE_NAMES)}"
        )
    # Not np.ascontiguousarray: it turns 0-d arrays into shape (1,).
    return array if array.flags.c_contiguous else array.copy(order="C")


def _write_safetensors(path, arrays: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    names = sorted(arrays)
    header: dict[str, object] = {"__metadata__": metadata}
    begin = 0
    for name in names:
        array = arrays[name]
        end = begin + array.nbytes
        header[name] = {
            "dtype": _DTYPE_NAMES[array.dtype],
            "shape": list(array.shape),
            "data_offsets": [begin, end],
        }
        begin = end
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * (-len(header_bytes) % 8)  # as safetensors pads: data starts 8-aligned
    chunks: list[bytes | np.ndarray] = [struct.pack("<Q", len(header_bytes)), header_bytes]
    chunks += [arrays[name].reshape(-1).view(np.uint8) for name in names]
    _atomic_write(path, chunks)


def _atomic_write(path, chunks) -> None:
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
class _Entry:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    begin: int
    end: int


def _read_safetensors(path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(name -> array sorted by name, __metadata__) of a validated safetensors file."""
    with _open(path) as f:
        size = os.fstat(f.fileno()).st_size
        header, data_start = _read_header(f, size, path)
        metadata = _parse_metadata(header.pop("__metadata__", {}), path)
        entries = [_parse_entry(name, info, path) for name, info in sorted(header.items())]
        _check_empty_spans([e.shape for e in entries], path)
        _check_offsets(entries, size - data_start, path)
        arrays = {e.name: _read_tensor(f, data_start, e, path) for e in entries}
    return arrays, metadata


def _read_header(f, size: int, path) -> tuple[dict, int]:
    if size < 8:
        raise _error(
            path, f"too short for a safetensors file: {size} bytes, under the 8-byte header length"
        )
    (n,) = struct.unpack("<Q", _read_exactly(f, 8, path))
    if n > size - 8:
        raise _error(
            path,
            f"header length {n} runs past the end of the file ({size} bytes): truncated, "
            "or not a safetensors file",
        )
    text = _read_exactly(f, n, path)
    try:
        header = _json(text.decode("utf-8"))
    except ValueError as e:  # not UTF-8, not JSON, nested too deeply, ints too long
        raise _error(path, f"header is not valid UTF-8 JSON: {e}") from e
    if not isinstance(header, dict):
        raise _error(path, f"header must be a JSON object, got {type(header).__name__}")
    return header, 8 + n


def _parse_metadata(metadata, path) -> dict[str, str]:
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise _error(path, "__metadata__ must map strings to strings")
    return metadata


def _parse_entry(name: str, info, path) -> _Entry:
    where = f"tensor {_show(name)}"
    if not isinstance(info, dict):
        raise _error(path, f"{where}: header entry must be an object, got {_show(info)}")
    _check_keys(info, ("dtype", "shape", "data_offsets"), where, path)
    dtype_name, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype_name, str) or dtype_name not in _DTYPES:
        raise _error(
            path, f"{where}: unknown dtype {_show(dtype_name)}; lowp reads {', '.join(_DTYPES)}"
        )
    if not isinstance(shape, list) or not all(_is_int(n) and n >= 0 for n in shape):
        raise _error(
            path, f"{where}: shape must be a list of non-negative ints, got {_show(shape)}"
        )
    if len(shape) > MAX_RANK:
        raise _error(path, f"{where}: rank {len(shape)} is over the {MAX_RANK} dims lowp reads")
    if (problem := _qtensor.empty_span_problem(shape)) is not None:
        raise _error(path, f"{where}: {problem}")
    pair = isinstance(offsets, list) and len(offsets) == 2
    if not pair or not all(_is_int(o) and o >= 0 for o in offsets) or offsets[0] > offsets[1]:
        raise _error(
            path, f"{where}: data_offsets must be ints 0 <= begin <= end, got {_show(offsets)}"
        )
    begin, end = offsets
    dtype = _DTYPES[dtype_name]
    nbytes = math.prod(shape) * dtype.itemsize
    if end - begin != nbytes:
        raise _error(
            path,
            f"{where}: shape {shape} of {dtype_name} is {nbytes} bytes but data_offsets "
            f"{offsets} hold {end - begin}",
        )
    return _Entry(name, dtype, tuple(shape), begin, end)


def _check_offsets(entries: list[_Entry], data_size: int, path) -> None:
    """The tensors must tile the data section exactly: no overlap, gap or trailing bytes."""
    position, previous = 0, None
    for e in sorted(entries, key=lambda e: (e.begin, e.end)):
        if e.begin < position:
            raise _error(
                path,
                f"tensor {_show(e.name)}: data_offsets [{e.begin}, {e.end}] overlap {_show(previous)}'s",
            )
        if e.begin > position:
            raise _error(
                path,
                f"tensor {_show(e.name)}: data_offsets [{e.begin}, {e.end}] leave a gap after byte "
                f"{position}; safetensors offsets must be contiguous",
            )
        if e.end > data_size:
            raise _error(
                path,
                f"tensor {_show(e.name)}: data_offsets [{e.begin}, {e.end}] out of bounds: the data "
                f"section has {data_size} bytes (truncated file?)",
            )
        position, previous = e.end, e.name
    if position != data_size:
        raise _error(path, f"trailing garbage: {data_size - position} bytes after the last tensor")


def _check_empty_spans(shapes, path) -> None:
    """Empty tensors may not together span more than one may (`_qtensor.MAX_EMPTY_SPAN`):
    each costs work in proportion to its span, and a header holds thousands."""
    total = sum(_qtensor.empty_span(shape) for shape in shapes)
    if total > _qtensor.MAX_EMPTY_SPAN:
        raise _error(
            path,
            f"its empty tensors span {total} together, over the {_qtensor.MAX_EMPTY_SPAN} "
            "lowp allows (a corrupt or hostile header?)",
        )


def _read_tensor(f, data_start: int, e: _Entry, path) -> np.ndarray:
    # One read into a fresh buffer: the array owns aligned memory and outlives the file.
    buffer = np.empty(e.end - e.begin, np.uint8)
    f.seek(data_start + e.begin)
    # numpy's stubs declare ndarray.__buffer__ only for Python >= 3.12; 3.11 has the C protocol.
    view, filled = memoryview(buffer), 0  # type: ignore[arg-type]
    while filled < len(buffer):
        n = f.readinto(view[filled:])
        if not n:
            raise _error(
                path, f"tensor {_show(e.name)}: the file ended early (changed while loading?)"
            )
        filled += n
    return buffer.view(e.dtype).reshape(e.shape)


# --- Helpers ---


class _FileEnded(ValueError):
    """The file held fewer bytes than its size said: another process is changing it."""


def _open(path):
    try:
        return open(path, "rb")
    except IsADirectoryError:
        raise _error(path, "a directory, not a safetensors file") from None


def _read_exactly(f, n: int, path) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise _FileEnded(str(_error(path, "the file ended early (changed while loading?)")))
    return data


def _json(text: str):
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


def _show(value: object) -> str:
    """repr(value) for an error message, cut to a readable length and depth."""
    return _REPR.repr(value)


def _error(path, message: str) -> ValueError:
    message = f"{os.fspath(path)}: {message}"
    if len(message) > _MAX_MESSAGE:
        half = _MAX_MESSAGE // 2
        message = (
            f"{message[:half]} [... {len(message) - 2 * half} characters cut ...] {message[-half:]}"
        )
    return ValueError(message)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_keys(doc: dict, expected, where: str, path, optional=()) -> None:
    missing = [k for k in expected if k not in doc]
    if missing:
        raise _error(path, f"{where}: missing field {_show(missing[0])}")
    unknown = sorted(set(doc) - set(expected) - set(optional))
    if unknown:  # an unknown field may change the meaning; refuse rather than guess
        raise _error(path, f"{where}: unknown field {_show(unknown[0])}")


def _refuse_duplicate_keys(pairs: list) -> dict:
    doc = dict(pairs)
    if len(doc) != len(pairs):  # json.loads would keep the last silently
        seen = set()
        for key, _ in pairs:  # the first key to repeat
            if key in seen:
                raise ValueError(f"duplicate key {_show(key)}")
            seen.add(key)
    return doc
