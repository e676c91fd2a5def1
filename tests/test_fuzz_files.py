"""Seeded fuzzing of lowp files (issue 23 item 9): valid files, mutated, loaded.

Every load of a mutated file either returns exactly what was saved (a mutation of header
padding, say) or raises ValueError naming the file; never another exception, never
changed bytes, dtypes, shapes or schemes (the checksums of lowp_format 3 catch what the
container cannot). One outcome more is allowed: a mutation of the `lowp` metadata key's
name leaves a plain safetensors file, which loads as its stored arrays, bytes unchanged.

Each mutated file `i` of source `s` and mutation `m` comes from
`np.random.default_rng((SEED, s, m, i))`. The default tier runs FAST_SECONDS, the slow
tier SLOW_SECONDS (bounded for CI); `LOWP_FUZZ_SECONDS` and `LOWP_FUZZ_SEED` override them:
`LOWP_FUZZ_SECONDS=600 python -m pytest -m slow tests/test_fuzz_files.py` fuzzes for ten
minutes: the files a shorter run checks, then more (file i is drawn from i, not the clock).
A new kind of file is fuzzed by adding a function rng -> {name: QTensor | array} to
SOURCES, a new way to damage one by adding a function (bytes, rng) -> bytes to MUTATIONS.
"""

import dataclasses
import json
import os
import struct
import time

import ml_dtypes
import numpy as np
import pytest

import lowp

SEED = int(os.environ.get("LOWP_FUZZ_SEED", "20261202"))
FAST_SECONDS, SLOW_SECONDS = 3.0, 30.0


# --- Valid files ---


def qtensors(rng: np.random.Generator) -> dict:
    """A few QTensors of different families and layouts, a plain array beside them."""
    x = (rng.standard_normal((4, 64)) * 3).astype(np.float32)
    x.reshape(-1)[int(rng.integers(x.size))] = np.nan  # a poisoned group
    mx = lowp.quantize(x, lowp.MXScaling(mode="rceil"))
    return {
        "layers.0.weight": mx,
        "layers.0.blocked": mx.with_scale_layout("cublas_blocked"),
        "layers.1.weight": lowp.quantize(x.astype(ml_dtypes.bfloat16), lowp.NVFP4Scaling()),
        "layers.2.weight": lowp.quantize(x[:, :8], lowp.AxisScaling(axis=0, pow2=True)),
        "bias": rng.standard_normal(4).astype(np.float32),
    }


def plain_arrays(rng: np.random.Generator) -> dict:
    """Plain arrays of many dtypes and ranks, 0-d and empty included."""
    return {
        "f32": rng.standard_normal((3, 5)).astype(np.float32),
        "bf16": rng.standard_normal(7).astype(ml_dtypes.bfloat16),
        "f16": rng.standard_normal((2, 2, 2)).astype(np.float16),
        "i64": rng.integers(-(2**40), 2**40, size=3),
        "u8": rng.integers(0, 256, size=(2, 3)).astype(np.uint8),
        "bool": rng.random(5) < 0.5,
        "e4m3": rng.standard_normal(8).astype(ml_dtypes.float8_e4m3fn),
        "scalar": np.array(rng.standard_normal(), np.float64),
        "empty": np.zeros((0, 3), np.float32),
    }


SOURCES = [qtensors, plain_arrays]


# --- Mutations ---


def _header_span(data: bytes) -> tuple[int, int]:
    (n,) = struct.unpack("<Q", data[:8])
    return 8, 8 + n


def flip_bit(data: bytes, rng) -> bytes:
    out = bytearray(data)
    i = int(rng.integers(len(out)))
    out[i] ^= 1 << int(rng.integers(8))
    return bytes(out)


def flip_data_bit(data: bytes, rng) -> bytes:
    """A bit of the tensor bytes: what safetensors cannot notice."""
    _, end = _header_span(data)
    if end >= len(data):
        return flip_bit(data, rng)
    out = bytearray(data)
    i = int(rng.integers(end, len(out)))
    out[i] ^= 1 << int(rng.integers(8))
    return bytes(out)


def change_header_digit(data: bytes, rng) -> bytes:
    """A digit of the header JSON to another digit: shapes, offsets, axes, blocks."""
    begin, end = _header_span(data)
    digits = [i for i in range(begin, end) if 48 <= data[i] <= 57]
    out = bytearray(data)
    i = int(rng.choice(digits))
    out[i] = 48 + (data[i] - 48 + int(rng.integers(1, 10))) % 10
    return bytes(out)


def change_header_letter(data: bytes, rng) -> bytes:
    """A letter of the header JSON to another: names, dtypes, kinds, modes, field names."""
    begin, end = _header_span(data)
    letters = [i for i in range(begin, end) if chr(data[i]).isalpha()]
    out = bytearray(data)
    i = int(rng.choice(letters))
    out[i] = int(rng.choice([c for c in b"abcdefghijklmnopqrstuvwxyzEFIU" if c != data[i]]))
    return bytes(out)


def truncate(data: bytes, rng) -> bytes:
    return data[: int(rng.integers(len(data)))]


def append(data: bytes, rng) -> bytes:
    return data + rng.integers(0, 256, size=int(rng.integers(1, 64)), dtype=np.uint8).tobytes()


def overwrite_run(data: bytes, rng) -> bytes:
    out = bytearray(data)
    i = int(rng.integers(len(out)))
    run = rng.integers(0, 256, size=int(rng.integers(1, 16)), dtype=np.uint8).tobytes()
    out[i : i + len(run)] = run[: len(out) - i]
    return bytes(out)


def header_length(data: bytes, rng) -> bytes:
    (n,) = struct.unpack("<Q", data[:8])
    n = int(rng.choice([0, 1, n - 1, n + 1, n + 8, 2**63, int(rng.integers(2**32))]))
    return struct.pack("<Q", n % 2**64) + data[8:]


MUTATIONS = [
    flip_bit,
    flip_data_bit,
    change_header_digit,
    change_header_letter,
    truncate,
    append,
    overwrite_run,
    header_length,
]


# --- The property ---


def _same_array(a, b) -> bool:
    return (
        isinstance(a, np.ndarray)
        and (a.dtype, a.shape) == (b.dtype, b.shape)
        and a.tobytes() == b.tobytes()
    )


def _same(got, want) -> bool:
    if isinstance(want, np.ndarray):
        return _same_array(got, want)
    return (
        isinstance(got, lowp.QTensor)
        and (got.scheme, got.shape, got.hp_dtype, got.scale_layout)
        == (want.scheme, want.shape, want.hp_dtype, want.scale_layout)
        and _same_array(got.codes, want.codes)
        and _same_array(got.scale, want.scale)
        and (got.global_scale is None) == (want.global_scale is None)
        and (want.global_scale is None or _same_array(got.global_scale, want.global_scale))
    )


def _axis_from_end(value):
    """A QTensor as `load` returns it: the scheme's axis counted from the end."""
    if isinstance(value, lowp.QTensor) and hasattr(value.scheme, "axis"):
        rank = len(value.shape)
        scheme = dataclasses.replace(value.scheme, axis=value.scheme.axis % rank - rank)
        return dataclasses.replace(value, scheme=scheme)
    return value


def _outcome(path, loaded: dict, stored: dict) -> str | None:
    """None if `loaded` (a mutated file's) is the original or its stored arrays unchanged."""
    tensors, arrays = stored["tensors"], stored["arrays"]
    if set(loaded) == set(tensors) and all(_same(loaded[k], tensors[k]) for k in loaded):
        return None
    if set(loaded) == set(arrays) and all(_same_array(loaded[k], arrays[k]) for k in loaded):
        return None  # the lowp key was renamed: a plain safetensors file, bytes unchanged
    return f"loaded other tensors or values: {sorted(loaded)}"


def fuzz(tmp_path, seconds: float) -> tuple[int, list[str]]:
    originals = []
    for s, source in enumerate(SOURCES):
        tensors = source(np.random.default_rng((SEED, s)))
        path = tmp_path / f"{source.__name__}.safetensors"
        lowp.save(path, tensors)
        loaded = lowp.load(path)
        assert set(loaded) == set(tensors)
        assert all(_same(loaded[k], _axis_from_end(v)) for k, v in tensors.items())
        stored = {"tensors": loaded, "arrays": lowp.read_arrays(path)}
        originals.append((source.__name__, path.read_bytes(), stored))

    start, count, failures = time.monotonic(), 0, []
    target = tmp_path / "mutated.safetensors"
    while count < len(SOURCES) * len(MUTATIONS) or time.monotonic() - start < seconds:
        s = count % len(SOURCES)
        m = (count // len(SOURCES)) % len(MUTATIONS)
        name, data, stored = originals[s]
        mutation = MUTATIONS[m]
        mutated = mutation(data, np.random.default_rng((SEED, s, m, count)))
        target.write_bytes(mutated)
        where = f"seed=({SEED}, {s}, {m}, {count}) {name} {mutation.__name__}"
        count += 1
        for read in (lowp.load, lowp.load_activations):
            try:
                loaded = read(target)
            except ValueError as err:
                if str(target) not in str(err):
                    failures.append(f"{where}: {read.__name__}: no file name in {err}")
                continue
            except Exception as err:  # noqa: BLE001 - the finding: named below
                failures.append(
                    f"{where}: {read.__name__} raised {type(err).__name__}: {err}"[:400]
                )
                continue
            if read is lowp.load and (problem := _outcome(target, loaded, stored)):
                failures.append(f"{where}: {problem}")
            if read is lowp.load_activations and loaded != {}:
                failures.append(f"{where}: load_activations found {loaded}")
    return count, failures


def _seconds(default: float) -> float:
    return float(os.environ.get("LOWP_FUZZ_SECONDS", default))


def test_mutated_files_load_as_saved_or_raise_value_error(tmp_path):
    count, failures = fuzz(tmp_path, _seconds(FAST_SECONDS))
    assert not failures, f"{len(failures)} of {count}:\n" + "\n".join(failures[:15])


@pytest.mark.slow
def test_mutated_files_load_as_saved_or_raise_value_error_for_longer(tmp_path):
    count, failures = fuzz(tmp_path, _seconds(SLOW_SECONDS))
    assert not failures, f"{len(failures)} of {count}:\n" + "\n".join(failures[:15])


def test_the_mutations_change_the_files():
    """A mutation that left every file as it was would fuzz nothing."""
    data = json.dumps({"a": 1}).encode()
    valid = struct.pack("<Q", len(data)) + data + b"\x00" * 8
    for m, mutation in enumerate(MUTATIONS):
        changed = sum(
            mutation(valid, np.random.default_rng((SEED, m, i))) != valid for i in range(20)
        )
        assert changed >= 15, mutation.__name__
