"""Saving and loading QTensors and arrays as safetensors files (spec §9).

The container itself (header, dtypes, validation, atomic writes) is `_safetensors`'s.

A QTensor `NAME` becomes the tensors `NAME.codes`, `NAME.scale` and (NVFP4 with a global
scale) `NAME.global_scale`, with its scheme, shape, hp_dtype and scale layout as JSON under
the header's `__metadata__` key `lowp`; optionally (lowp_format 2) also the scheme its layer
quantizes inputs with at run time, its "activation". Byte order is little-endian on disk;
lowp assumes a little-endian host, as numpy's float8/bfloat16 dtypes in ml_dtypes do.
"""

import dataclasses
import json
import os
import re
import zipfile
import zlib
from collections.abc import Mapping

import numpy as np

from lowp import _qtensor, _safetensors, _schemes

# The newest lowp_format this lowp reads. 2 = 1 plus the optional entry field "activation";
# 3 = 2 plus the checksums ("checksums", "tensors_checksum"), which `save` writes unless
# told not to; without them it writes 1, or 2 when it records an activation.
LOWP_FORMAT = 3
_CHECKSUMS_FORMAT = 3
METADATA_KEY = "lowp"
_CHECKSUM = re.compile(r"crc32:[0-9a-f]{8}")


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
    _safetensors.write(path, arrays, {METADATA_KEY: lowp_json})


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
    arrays, metadata = _safetensors.read(path)
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
        raise _safetensors.error(
            path,
            f"tensor {_safetensors.show(clashes[0])} is both a plain tensor and a QTensor entry",
        )
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
    with _safetensors.open_file(path) as f:
        header, _ = _safetensors.read_header(f, os.fstat(f.fileno()).st_size, path)
    metadata = _safetensors.parse_metadata(header.get("__metadata__", {}), path)
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
        return _safetensors.read(path)[0]
    if suffix == ".npz":
        if not zipfile.is_zipfile(path):  # else numpy guesses "pickled data" and says so
            raise _safetensors.error(
                path, "not a .npz file (an .npz is a zip archive of .npy files)"
            )
        try:
            with np.load(path, allow_pickle=False) as archive:
                arrays = {name: archive[name] for name in archive.files}
        except (ValueError, OSError, zipfile.BadZipFile) as err:
            raise _safetensors.error(path, f"unreadable .npz: {err}") from err
        for name, array in arrays.items():
            if (problem := _qtensor.empty_span_problem(array.shape)) is not None:
                raise _safetensors.error(path, f"tensor {_safetensors.show(name)}: {problem}")
        _safetensors.check_empty_spans([a.shape for a in arrays.values()], path)
        return arrays
    raise _safetensors.error(
        path, f"expected a .safetensors or .npz file, got suffix {_safetensors.show(suffix)}"
    )


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
            shown = _safetensors.show(name)
            raise ValueError(  # noqa: TRY004
                f"tensor names must be str, got {shown} ({type(name).__name__})"
            )
        if isinstance(value, _qtensor.QTensor):
            parts, entries[name] = _qtensor_parts(name, value)
        elif isinstance(value, np.ndarray):
            parts = {name: _safetensors.plain_array(name, value)}
        else:
            raise TypeError(
                f"tensor {_safetensors.show(name)}: expected a QTensor or numpy array, got {type(value).__name__}"
            )
        for stored, array in parts.items():
            if stored == "__metadata__":
                raise ValueError(
                    f"tensor name {_safetensors.show(name)}: '__metadata__' is reserved by safetensors"
                )
            if stored in owners:
                raise ValueError(
                    f"tensors {_safetensors.show(owners[stored])} and {_safetensors.show(name)} would both be stored as {_safetensors.show(stored)}"
                )
            owners[stored], arrays[stored] = name, array
    return arrays, entries


def _qtensor_parts(name: str, q: "_qtensor.QTensor") -> tuple[dict[str, np.ndarray], dict]:
    from lowp.checkpoints import _dequantize  # the checkpoints package imports this module

    _dequantize.refuse_origin(q, f"save: tensor {_safetensors.show(name)}", "lowp.dequantize(q)")
    try:  # rebuild to re-run the checks: arrays are mutable and may have been reshaped since
        q = dataclasses.replace(q)
    except (TypeError, ValueError) as e:
        raise type(e)(f"tensor {_safetensors.show(name)}: {e}") from e
    parts = {f"{name}.codes": q.codes, f"{name}.scale": q.scale}
    if q.global_scale is not None:
        parts[f"{name}.global_scale"] = q.global_scale
    entry = {
        "scheme": _scheme_to_json(q.scheme, len(q.shape)),
        "shape": list(q.shape),
        "hp_dtype": q.hp_dtype,
        "scale_layout": q.scale_layout,
    }
    return {stored: _safetensors.plain_array(stored, a) for stored, a in parts.items()}, entry


def _record_activations(entries: dict[str, dict], activations) -> None:
    """Add each QTensor's "activation" field (a scheme's JSON, or None) to its entry."""
    if not isinstance(activations, Mapping):
        raise TypeError(
            f"activations must be a dict name -> Scheme or None, got {_safetensors.show(activations)}"
        )
    for name, scheme in activations.items():
        if name not in entries:
            raise ValueError(
                f"activations[{_safetensors.show(name)}]: no QTensor of that name is being saved"
            )
        if scheme is None:
            entries[name][_ACTIVATION] = None
            continue
        if getattr(scheme, "axis", -1) != -1:  # -1 is the only axis meaning K at every rank
            raise ValueError(
                f"activations[{_safetensors.show(name)}] = {scheme}: an activation is quantized along K, its "
                "last axis (spec §8): spell it axis=-1"
            )
        try:
            entries[name][_ACTIVATION] = _scheme_to_json(scheme, _ACTIVATION_RANK)
        except TypeError as e:
            raise TypeError(f"activations[{_safetensors.show(name)}]: {e}") from e


def _scheme_to_json(scheme: _schemes.Scheme, rank: int) -> dict:
    scheme_type, _ = SCHEME_FIELDS.get(type(scheme).__name__, (None, {}))
    if type(scheme) is not scheme_type:  # a subclass could carry fields we would drop
        raise TypeError(f"cannot save {scheme!r}: lowp files hold {tuple(SCHEME_FIELDS)} only")
    return scheme.to_fields(rank)  # spec §9: an axis stored normalised


def _parse_lowp_metadata(text: str, path) -> tuple[int, dict, dict | None]:
    """The lowp_format, `tensors` map and `checksums` map (None before lowp_format 3) of
    lowp's metadata, after checking their shape and the entries' checksum."""
    try:
        doc = _safetensors.parse_json(text)
    except ValueError as e:
        raise _safetensors.error(
            path, f"the {METADATA_KEY!r} metadata is not valid JSON: {e}"
        ) from e
    if not isinstance(doc, dict):
        raise _safetensors.error(path, f"the {METADATA_KEY!r} metadata must be a JSON object")
    version = doc.get("lowp_format")
    if not _safetensors.is_int(version):
        raise _safetensors.error(
            path,
            f"the {METADATA_KEY!r} metadata needs an int lowp_format: {_safetensors.show(version)}",
        )
    if version > LOWP_FORMAT:
        raise _safetensors.error(
            path,
            f"written by a newer lowp (lowp_format {version}); this lowp reads lowp_format "
            f"{LOWP_FORMAT}: upgrade lowp",
        )
    if version < 1:
        raise _safetensors.error(path, f"unknown lowp_format {version}")
    where = f"the {METADATA_KEY!r} metadata"
    fields: tuple[str, ...] = ("lowp_format", "tensors")
    if version >= _CHECKSUMS_FORMAT:
        fields += ("checksums", "tensors_checksum")
    _safetensors.check_keys(doc, fields, where, path)
    if not isinstance(doc["tensors"], dict):
        raise _safetensors.error(path, f"{where}: field 'tensors' must be an object")
    if version < _CHECKSUMS_FORMAT:
        return version, doc["tensors"], None
    if not isinstance(doc["checksums"], dict):
        raise _safetensors.error(path, f"{where}: field 'checksums' must be an object")
    for name, value in [("the tensors", doc["tensors_checksum"]), *doc["checksums"].items()]:
        if not isinstance(value, str) or not _CHECKSUM.fullmatch(value):
            raise _safetensors.error(
                path,
                f"{where}: checksum of {_safetensors.show(name)} must be 'crc32:' and 8 hex digits, "
                f"got {_safetensors.show(value)}",
            )
    if _entries_checksum(doc["tensors"]) != doc["tensors_checksum"]:
        raise _safetensors.error(
            path,
            f"{where}'s tensors changed since the file was saved: their checksum "
            f"{_entries_checksum(doc['tensors'])} is not the {doc['tensors_checksum']} recorded",
        )
    return version, doc["tensors"], doc["checksums"]


def _checksum(array: np.ndarray) -> str:
    """CRC-32 of a stored tensor's dtype name, shape and bytes: a byte, dtype or shape
    changed to another legal one (which safetensors would load) changes it."""
    crc = zlib.crc32(f"{_safetensors.DTYPE_NAMES[array.dtype]}{list(array.shape)}".encode())
    # numpy's stubs declare the buffer protocol only for Python >= 3.12 (as _safetensors.read_tensor).
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
            raise _safetensors.error(
                path, f"tensor {_safetensors.show(name)} has no checksum in a checksummed file"
            )
    for name in checksums:
        if name not in arrays:
            raise _safetensors.error(
                path, f"a checksum for {_safetensors.show(name)}, a tensor the file does not hold"
            )
    if not verify:
        return
    for name, array in arrays.items():
        if _checksum(array) != checksums[name]:
            raise _safetensors.error(
                path,
                f"tensor {_safetensors.show(name)}: its bytes, dtype or shape changed since it was saved "
                f"({_checksum(array)}, the file records {checksums[name]})",
            )


_NOT_RECORDED = object()


def _entry_activation(name: str, entry, version: int, path):
    """Check entry `name`'s fields; its activation scheme, None, or _NOT_RECORDED."""
    where = f"QTensor {_safetensors.show(name)}"
    if not isinstance(entry, dict):
        raise _safetensors.error(
            path, f"{where}: metadata entry must be an object, got {_safetensors.show(entry)}"
        )
    optional = (_ACTIVATION,) if version >= 2 else ()  # in a version-1 file: unknown
    _safetensors.check_keys(entry, _ENTRY_FIELDS, where, path, optional)
    if _ACTIVATION not in entry:
        return _NOT_RECORDED
    doc = entry[_ACTIVATION]
    if doc is None:
        return None
    if not isinstance(doc, dict):
        raise _safetensors.error(
            path,
            f"{where}: field 'activation' must be a scheme object or null, got {_safetensors.show(doc)}",
        )
    scheme = _scheme_from_json(doc, f"{where} activation", path)
    if not isinstance(scheme, _AXIS_SCHEMES):
        return scheme
    if scheme.axis != _ACTIVATION_RANK - 1:
        raise _safetensors.error(
            path,
            f"{where} activation: axis {scheme.axis} is not K: an activation (M, K) is "
            f"quantized along its last axis, stored as {_ACTIVATION_RANK - 1} (spec §9)",
        )
    return dataclasses.replace(scheme, axis=-1)


def _qtensor_from_entry(name: str, entry, arrays: dict, path) -> "_qtensor.QTensor":
    """Rebuild QTensor `name` (entry checked by `_entry_activation`), taking its component
    arrays out of `arrays`."""
    where = f"QTensor {_safetensors.show(name)}"
    scheme = _scheme_from_json(entry["scheme"], where, path)
    shape = entry["shape"]
    if not isinstance(shape, list) or not all(_safetensors.is_int(n) and n >= 0 for n in shape):
        raise _safetensors.error(
            path,
            f"{where}: field 'shape' must be a list of ints >= 0, got {_safetensors.show(shape)}",
        )
    for field in ("hp_dtype", "scale_layout"):
        if not isinstance(entry[field], str):
            raise _safetensors.error(
                path,
                f"{where}: field {_safetensors.show(field)} must be a string, got {_safetensors.show(entry[field])}",
            )
    if isinstance(scheme, _AXIS_SCHEMES):
        # On disk the axis is non-negative (spec §9); in memory lowp spells axes from the
        # end, as its presets and recipes do, so a loaded MXScaling equals MXScaling().
        if scheme.axis >= len(shape):
            raise _safetensors.error(
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
        raise _safetensors.error(path, f"{where} does not match its arrays: {e}") from e


def _scheme_from_json(doc, where: str, path) -> _schemes.Scheme:
    if not isinstance(doc, dict):
        raise _safetensors.error(
            path, f"{where}: field 'scheme' must be an object, got {_safetensors.show(doc)}"
        )
    kind = doc.get("kind")
    if not isinstance(kind, str) or kind not in SCHEME_FIELDS:
        raise _safetensors.error(
            path,
            f"{where}: unknown scheme kind {_safetensors.show(kind)}; expected one of {tuple(SCHEME_FIELDS)}",
        )
    _, fields = SCHEME_FIELDS[kind]
    _safetensors.check_keys(doc, ("kind", *fields), f"{where} scheme", path)
    for field, json_type in fields.items():
        value = doc[field]
        right_type = (
            _safetensors.is_int(value) if json_type is int else isinstance(value, json_type)
        )
        if not right_type:
            raise _safetensors.error(
                path,
                f"{where}: scheme field {_safetensors.show(field)} must be {json_type.__name__}, got {_safetensors.show(value)}",
            )
    if "axis" in fields and doc["axis"] < 0:
        raise _safetensors.error(
            path,
            f"{where}: scheme field 'axis' must be stored normalised, >= 0 (spec §9), got "
            f"{doc['axis']}",
        )
    try:
        return _schemes.from_fields(doc)
    except (TypeError, ValueError) as e:
        raise _safetensors.error(path, f"{where}: invalid scheme: {e}") from e


def _take(arrays: dict, name: str, part: str, path) -> np.ndarray:
    stored = f"{name}.{part}"
    if stored not in arrays:
        raise _safetensors.error(
            path, f"QTensor {_safetensors.show(name)}: missing tensor {_safetensors.show(stored)}"
        )
    return arrays.pop(stored)
