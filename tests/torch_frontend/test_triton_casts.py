"""The Triton fast casts against the NumPy reference `lowp.quantize`, byte for byte.

Three tiers:

- interpreter (CPU, where triton is installed): the kernels run under Triton's CPU
  interpreter, in a subprocess started with TRITON_INTERPRET=1 (triton reads it when a
  kernel is defined, so it cannot be switched on inside this process, and other tests
  must keep compiling normally). Every supported scheme x element format, axis and MX
  mode, float32 with every edge case of lowp_apps.conformance (spec §6: NaN, Inf, zeros,
  ties, above max, powers of two, subnormals, huge, tiny) and bfloat16/float16 on a
  rotation, empty shapes, both orientations (`quantize_both`), and a second run with
  tiny tiles on odd shapes so that partial tiles, several chunks per row and several
  tiles per amax program are exercised. The interpreter emulates Triton with NumPy:
  it cannot show GPU numerics (approximate division, FMA contraction, the native fp8
  conversion, which it replaces by the integer encoder; see `_triton_kernels`).
- GPU (CUDA only): the same plan, the Triton path against the reference and against
  the torch-ops path on CUDA, plus 1M random values per scheme and input dtype at
  shapes that use the real tiles (rows longer than one pass included).
- dispatch (everywhere, no triton needed): when `quantize` takes which path, and the
  errors of `cast_kernels`.
"""

import contextlib
import dataclasses
import functools
import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
import unittest.mock
import warnings

import numpy as np
import pytest
import torch

import lowp
import lowp_torch
from lowp_apps.conformance import cases, compare
from lowp_torch import _cast_kernels

HAS_TRITON = importlib.util.find_spec("triton") is not None
NO_TRITON = "triton is not installed (the wheel pytorch's CUDA builds depend on)"
E4M3, E5M2 = "float8_e4m3fn", "float8_e5m2"
# Tiles small enough that the odd SMALL_TILE_SHAPES span several of them, partially.
SMALL_TILES = {
    "_FLAT_BLOCK": 64,
    "_AMAX_PROGRAMS": 2,
    "_ROWS_ONE_PASS": 16,
    "_ROWS_CHUNK": 16,
    "_TILE_ELEMENTS": 64,
    "_TILE": (4, 16),
    "_TILE_COLS": (4, 16),
    "_AMAX_ROW_TILES": 2,
    "_AMAX_TILE": (2, 32),  # the column-amax pass in tiles of its own, unlike the cast's
}


# Edge cases where the input dtype matters (its conversion, subnormals, range), and a
# few that fill every tile of the tiny-tile run with different groups.
HP_DTYPE_EDGES = ("random", "ties", "subnormal", "only_subnormals", "huge", "hp_patterns")
SMALL_TILE_EDGES = ("random", "nonfinite_groups", "random_exponents")


@dataclasses.dataclass(frozen=True)
class Case:
    """One configuration of lowp_apps.conformance, and how the Triton path runs it.

    variant: "quantize" (through `lowp_torch.quantize` under cast_kernels("triton")),
    "small_tiles" (the same with SMALL_TILES), "both" (`quantize_both`, compared
    with the reference along axis -1 and along axis -2, its column codes written
    transposed), "both_small_tiles" (the same with SMALL_TILES: many tiles, masked
    ones at the edges, each storing its transposed codes), "transposed" (the input a
    transposed view of a contiguous tensor, quantized along its last axis from that
    tensor without a copy: `_triton_casts.transposed_source`) or
    "transposed_small_tiles".
    """

    config: cases.Configuration
    variant: str = "quantize"
    edges: tuple[str, ...] | None = None  # the edge cases it runs; None: all of them

    @property
    def id(self) -> str:
        return f"{self.variant}-{self.config.id}"


def _schemes():
    """Every scheme the kernels implement, each element format, axis and MX mode."""
    out = []
    for fmt in (E4M3, E5M2):
        out += [lowp.TensorScaling(fmt, pow2=p) for p in (False, True)]
        out += [lowp.AxisScaling(fmt, axis=a, pow2=p) for a in (-1, 0) for p in (False, True)]
        out += [lowp.MXScaling(fmt, block=8, mode=m) for m in cases.MX_MODES]
        out.append(lowp.MXScaling(fmt, block=2, mode="rceil", axis=0))
        # Tiles of a row (the rows pass), of a column (the column passes) and 2-D (the
        # tile kernel), a multiple of the dims or partial at the edges.
        out += [
            lowp.BlockScaling(fmt, block=b, pow2=p)
            for b, p in (((1, 8), False), ((2, 1), True), ((4, 4), False), ((3, 5), True))
        ]
    out += [lowp.MXScaling(mode="rceil"), lowp.AxisScaling(axis=1, pow2=True)]
    out.append(lowp.MXScaling(E5M2, block=2, mode="floor", axis=1))
    return out


def plan() -> list[Case]:
    """The cases both the interpreter and the GPU tiers run: every scheme with float32
    and every edge case; bfloat16 / float16 (in turn) with the edge cases where the
    input dtype matters; empty shapes; tiny tiles (in turn) on a few inputs. Ranks
    rotate. Sized for the interpreter: about 25 s on each of two CPUs."""
    out = []
    for j, scheme in enumerate(_schemes()):
        axis = getattr(scheme, "axis", -1)
        rank = next(r for r in (1, 2, 3, 4, 4) if r >= 1 + j % 4 and _admits(scheme, r))
        out.append(Case(cases.Configuration(scheme, cases.SHAPES[rank])))
        hp_dtype = ("bfloat16", "float16", None)[j % 3]
        if hp_dtype:
            config = cases.Configuration(scheme, cases.SHAPES[rank], hp_dtype)
            out.append(Case(config, edges=HP_DTYPE_EDGES))
        if j % 4 == 1:
            out.append(Case(cases.Configuration(scheme, cases.EMPTY_SHAPES[rank])))
        if j % 2 == 0 or axis == 1:
            block = getattr(scheme, "block", 8)
            block = max(block) if isinstance(block, tuple) else block
            shape = (3, 6, 40) if axis == 1 else (6, 40 if block <= 8 else 64)
            config = cases.Configuration(scheme, shape, "bfloat16")
            out.append(Case(config, "small_tiles", SMALL_TILE_EDGES))
    for scheme in (
        lowp.TensorScaling(),
        lowp.TensorScaling(E5M2, pow2=True),
        lowp.AxisScaling(pow2=True),
        lowp.AxisScaling(E5M2),
        lowp.MXScaling(block=2, mode="rceil"),
        lowp.MXScaling(E5M2, block=2, mode="ceil"),
    ):
        out.append(Case(cases.Configuration(scheme, (6, 32), "bfloat16"), "both"))
    out.append(Case(cases.Configuration(lowp.MXScaling(block=2), (6, 0)), "both"))
    out.append(Case(cases.Configuration(lowp.TensorScaling(), (0, 5)), "both"))
    for scheme in (
        lowp.TensorScaling(pow2=True),
        lowp.AxisScaling(pow2=True),
        lowp.MXScaling(block=2, mode="rceil"),
    ):
        config = cases.Configuration(scheme, (6, 40), "bfloat16")
        out.append(Case(config, "both_small_tiles", SMALL_TILE_EDGES))
    # Transposed views: 2-D and 3-D (a stacked weight's w.T, outer > 1), an empty one.
    for scheme, shape in (
        (lowp.AxisScaling(pow2=True), (6, 32)),
        (lowp.AxisScaling(E5M2, axis=2), (3, 5, 6)),
        (lowp.MXScaling(block=2, mode="rceil"), (3, 6, 8)),
        (lowp.MXScaling(E5M2, block=8, mode="ceil"), (5, 16)),
        (lowp.AxisScaling(), (0, 6)),
    ):
        out.append(Case(cases.Configuration(scheme, shape, "bfloat16"), "transposed"))
    for scheme in (lowp.AxisScaling(), lowp.MXScaling(block=2, mode="floor")):
        config = cases.Configuration(scheme, (3, 6, 40), "bfloat16")
        out.append(Case(config, "transposed_small_tiles", SMALL_TILE_EDGES))
    return out


def _admits(scheme, rank: int) -> bool:
    """Whether `scheme` takes the conformance shape of `rank` as its axis (not the last)."""
    try:
        scheme.check_shape(cases.SHAPES[rank])
    except ValueError:
        return False
    return getattr(scheme, "axis", -1) in (-1, rank - 1) or rank > 1


PLAN = plan()


# --- running a case (in the interpreter subprocess, or on CUDA) -------------------------


def _outputs(q) -> compare.Outputs:
    """A quantized tensor as the conformance comparison takes it (and its dequantization
    by lowp_torch, which checks the scale dtypes and shapes the wrapper gave it)."""
    deq = lowp_torch.dequantize(q, torch.float32).cpu().numpy()
    return compare.Outputs(lowp_torch.to_lowp(q), {"float32": deq})


def _reference(x, scheme):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # overflow in poisoned groups
        return lowp.quantize(x, scheme)


def _differences(x, ref, q) -> list[str]:
    with np.errstate(over="ignore"):  # see compare.reference_dequantized
        return compare.differences(x, ref, _outputs(q))


def run_case(case: Case, device: str) -> list[str]:
    """Every difference from the reference, over every edge-case input of `case`."""
    from lowp_torch import _triton_casts

    failures = []
    scheme = case.config.scheme
    for edge, x in cases.inputs(case.config):
        if case.edges is not None and edge.split("#")[0] not in case.edges:
            continue
        t = torch.from_numpy(_bits_of(x)).view(getattr(torch, case.config.hp_dtype)).to(device)
        tiles = (
            unittest.mock.patch.multiple(_triton_casts, **SMALL_TILES)
            if case.variant.endswith("small_tiles")
            else contextlib.nullcontext()
        )
        if case.variant.startswith("both"):
            with tiles:
                rows, cols = _triton_casts.quantize_both(t, scheme)
            along_first = scheme.permuted((1, 0))  # TensorScaling: the scheme itself
            problems = _differences(x, _reference(x, scheme), rows)
            problems += [f"axis -2: {p}" for p in _differences(x, _reference(x, along_first), cols)]
            if not cols.codes.t().is_contiguous():  # written K-major for the backward GEMMs
                problems.append(f"axis -2 codes not transposed: strides {cols.codes.stride()}")
        elif case.variant.startswith("transposed"):
            t = t.transpose(-2, -1).contiguous().transpose(-2, -1)
            spy = unittest.mock.patch.object(
                _triton_casts, "_launch_transposed", wraps=_triton_casts._launch_transposed
            )
            with tiles, spy as launch, lowp_torch.cast_kernels("triton"):
                q = lowp_torch.quantize(t, scheme)
            problems = _differences(x, _reference(x, scheme), q)
            if not launch.called and not t.is_contiguous():
                problems.append("the transposed view was not read in place")
            if not q.codes.is_contiguous():
                problems.append(f"codes not contiguous: strides {q.codes.stride()}")
        else:
            with tiles, lowp_torch.cast_kernels("triton"):
                q = lowp_torch.quantize(t, scheme)
            problems = _differences(x, _reference(x, scheme), q)
        failures += [f"[{edge}] {p}" for p in problems]
    return failures


def _bits_of(x: np.ndarray) -> np.ndarray:
    """x's bits as a NumPy int array torch can take (torch has no ml_dtypes bfloat16)."""
    return x.view({2: np.int16, 4: np.int32}[x.dtype.itemsize])


# --- tier 1: the interpreter ------------------------------------------------------------


SHARDS = 2  # interpreter subprocesses side by side: CI has two CPUs and pytest uses one


@pytest.fixture(scope="module")
def interpreted():
    """{case id: failures} from interpreter subprocesses running PLAN, SHARDS at once."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [env.get("PYTHONPATH")] if p])
    shards = [
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), str(k)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(SHARDS)
    ]
    results = {}
    for shard in shards:
        out, err = shard.communicate(timeout=600)
        if shard.returncode != 0:
            pytest.fail(f"the interpreter run failed:\n{err[-4000:]}")
        results.update(json.loads(out.strip().splitlines()[-1]))
    return results


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TRITON, reason=NO_TRITON)
@pytest.mark.parametrize("case", PLAN, ids=lambda c: c.id)
def test_interpreted_kernels_match_lowp(interpreted, case):
    failures = interpreted[case.id]
    assert not failures, "\n".join(failures[:20])


def _interpreter_main(shard: int):
    """The subprocess: run every SHARDS-th case of PLAN from `shard` on CPU tensors,
    print {case id: failures} as JSON."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    torch.set_num_threads(1)
    # The interpreter multiplies the values of poisoned groups in NumPy, as the
    # reference does under np.errstate: overflow there is expected and overwritten.
    warnings.simplefilter("ignore", RuntimeWarning)
    results = {}
    for case in PLAN[shard::SHARDS]:
        try:
            results[case.id] = run_case(case, "cpu")
        except Exception as e:  # noqa: BLE001 - reported per case, the others still run
            results[case.id] = [f"error: {e!r}"]
    print(json.dumps(results))


# --- tier 1b: the GPU code, compiled for the H200 (sm_90) on the CPU --------------------
#
# What the interpreter cannot show, the PTX can: each kernel as Triton compiles it for
# sm_90, with the properties spec §0 needs read off the instructions.


def _ptx_variants(native: bool) -> dict:
    """name -> (kernel, signature, constexprs, the fp8 conversion it makes or None,
    whether it divides). Every kernel of `_triton_kernels` and `_triton_grouped` appears: compiling them is
    also what catches code the interpreter accepts and Triton does not."""
    from lowp_torch import _triton_casts
    from lowp_torch import _triton_grouped as G
    from lowp_torch import _triton_kernels as K

    def fmt(name):
        args = _triton_casts._element_args(lowp.ELEMENT_FORMATS[name], torch.empty(0))
        return args | {"NATIVE": native}

    flat = {"x_ptr": "*bf16", "amax_ptr": "*i32", "codes_ptr": "*u8", "scale_ptr": "*fp32"}
    rows = {"x_ptr": "*fp16", "codes_ptr": "*u8", "scale_ptr": "*fp32", "rows": "i32"}
    grid = {"R": "i32", "C": "i32", "tiles_r": "i32", "tiles_c": "i32"}
    mx = {"x_ptr": "*bf16", "row_codes_ptr": "*u8", "row_scale_ptr": "*u8"}
    mx |= {"col_codes_ptr": "*u8", "col_scale_ptr": "*u8"} | grid
    axis = {"x_ptr": "*fp32", "row_amax_ptr": "*i32", "row_codes_ptr": "*u8"}
    axis |= {"row_scale_ptr": "*fp32", "col_amax_ptr": "*i32", "col_codes_ptr": "*u8"}
    axis |= {"col_scale_ptr": "*fp32"} | grid
    mx_consts = {"GROUP": 32, "MODE": 2, "EMAX": 8, "MAX_MANTISSA": 0x600000}
    both = {"ROWS": True, "COLS": True}
    amax = {"x_ptr": "*bf16", "row_amax_ptr": "*i32", "col_amax_ptr": "*i32"} | grid
    tokens = {"x_ptr": "*bf16", "offs_ptr": "*i32"}
    return {
        "tensor-amax": (
            K.tensor_amax_kernel,
            {"x_ptr": "*fp32", "amax_ptr": "*i32", "n": "i64"},
            {"TILES": 4, "BLOCK": 4096},
            None,
            False,
        ),
        "axis-amax-both": (
            K.axis_amax_2d_kernel,
            amax,
            both | {"BLOCK_R": 16, "BLOCK_C": 256, "ROW_TILES": 16},
            None,
            False,
        ),
        "tensor-e4m3": (
            K.tensor_cast_kernel,
            flat | {"n": "i32"},
            {"POW2": False, "BLOCK": 4096} | fmt(E4M3),
            "e4m3",
            True,
        ),
        "tensor-e5m2-pow2": (
            K.tensor_cast_kernel,
            flat | {"n": "i64"},
            {"POW2": True, "BLOCK": 4096} | fmt(E5M2),
            "e5m2",
            True,
        ),
        "tensor-both": (
            K.tensor_cast_2d_kernel,
            {"x_ptr": "*bf16", "amax_ptr": "*i32", "codes_ptr": "*u8", "codes_t_ptr": "*u8"}
            | {"scale_ptr": "*fp32", "scale_t_ptr": "*fp32"}
            | grid,
            {"POW2": False, "BLOCK_R": 64, "BLOCK_C": 64} | fmt(E4M3),
            "e4m3",
            True,
        ),
        "rows-one-pass": (
            K.axis_rows_kernel,
            rows | {"cols": "i32"},
            {"POW2": True, "BLOCK_M": 1, "BLOCK_K": 16384, "CHUNKS": 1} | fmt(E4M3),
            "e4m3",
            True,
        ),
        "rows-chunked": (
            K.axis_rows_kernel,
            rows | {"cols": "i32"},
            {"POW2": False, "BLOCK_M": 1, "BLOCK_K": 4096, "CHUNKS": 9} | fmt(E5M2),
            "e5m2",
            True,
        ),
        "axis-both": (
            K.axis_cast_2d_kernel,
            axis,
            both | {"COLS_T": True, "POW2": False, "BLOCK_R": 16, "BLOCK_C": 256} | fmt(E4M3),
            "e4m3",
            True,
        ),
        "block-tiles": (
            K.block_tiles_kernel,
            {"x_ptr": "*bf16", "codes_ptr": "*u8", "scale_ptr": "*fp32"} | grid,
            {"POW2": False, "TILE_R": 128, "TILE_C": 128, "CHUNK_R": 32, "BLOCK_C": 128}
            | {"CHUNKS": 4}
            | fmt(E4M3),
            "e4m3",
            True,
        ),
        "mx-both": (
            K.mx_2d_kernel,
            mx,
            both | mx_consts | {"COLS_T": True, "BLOCK_R": 32, "BLOCK_C": 256} | fmt(E4M3),
            "e4m3",
            False,
        ),
        # the grouped operands' kernels (`_triton_grouped`)
        "grouped-tokens": (
            G.tokens_axis_kernel,
            tokens | {"codes_ptr": "*u8", "scale_ptr": "*fp32", "T": "i32", "C": "i32"},
            {"POW2": True, "BLOCK_T": 64, "BLOCK_C": 64} | fmt(E4M3),
            "e4m3",
            True,
        ),
        "grouped-tokens-mx": (
            G.tokens_mx_kernel,
            tokens
            | {"slots_ptr": "*i64", "codes_ptr": "*u8", "scale_ptr": "*u8"}
            | {"T": "i32", "C": "i32", "capacity": "i32"},
            mx_consts | {"BLOCK_C": 64} | fmt(E4M3),
            "e4m3",
            False,
        ),
        "grouped-rows-tokens-amax": (
            G.rows_tokens_amax_kernel,
            tokens | {"row_amax_ptr": "*i32", "col_amax_ptr": "*i32", "C": "i32"},
            {"BLOCK_T": 64, "BLOCK_C": 64},
            None,
            False,
        ),
        "grouped-rows-tokens": (
            G.rows_tokens_cast_kernel,
            tokens
            | {"row_amax_ptr": "*i32", "row_codes_ptr": "*u8", "row_scale_ptr": "*fp32"}
            | {"col_amax_ptr": "*i32", "col_codes_ptr": "*u8", "col_scale_ptr": "*fp32"}
            | {"T": "i32", "C": "i32"},
            {"POW2": True, "BLOCK_T": 64, "BLOCK_C": 64} | fmt(E4M3),
            "e4m3",
            True,
        ),
        "grouped-tail": (
            G.tokens_tail_kernel,
            {"codes_ptr": "*u8", "offs_ptr": "*i32", "experts": "i32", "T": "i32", "C": "i32"},
            {"BLOCK_T": 64, "BLOCK_C": 64},
            None,
            False,
        ),
    }


PTX_VARIANTS = ["tensor-amax", "tensor-e4m3", "tensor-e5m2-pow2", "tensor-both", "rows-one-pass"]
PTX_VARIANTS += ["rows-chunked", "axis-amax-both", "axis-both", "block-tiles", "mx-both"]
PTX_VARIANTS += ["grouped-tokens", "grouped-rows-tokens-amax", "grouped-rows-tokens"]
PTX_VARIANTS += ["grouped-tokens-mx", "grouped-tail"]


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TRITON, reason=NO_TRITON)
@pytest.mark.parametrize("sm", [80, 89, 90])
@pytest.mark.parametrize("variant", PTX_VARIANTS)
def test_compiled_code_divides_exactly_never_contracts_or_flushes(variant, sm):
    """Compiled for sm_80, sm_89 and sm_90, the only float arithmetic is the products
    and, for float scales, `div.rn.f32` (IEEE; Triton's `/` would be `div.full.f32`,
    approximate): no add for a product to be contracted into (no FMA). The fp8
    conversion, where `native_cast_exact` allows Triton's (sm_90+), is the one
    round-to-nearest-even `cvt.rn.satfinite.*.f32`, fed by `mul.rn.ftz.f32`, whose flush
    is the spec's (§0.2) and the only `.ftz` there is; below it (sm_89 rounds to f16
    first, sm_80 rounds e5m2 ties up) there is no fp8 conversion and no `.ftz` at all:
    plain `mul.f32` and the integer encoder (spec §0.4-§0.6)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from lowp_torch import _triton_casts

    native = _triton_casts.native_cast_exact(divmod(sm, 10))
    kernel, signature, constexprs, fp8, divides = _ptx_variants(native)[variant]
    source = ASTSource(
        fn=kernel,
        signature=signature | dict.fromkeys(constexprs, "constexpr"),
        constexprs=constexprs,
    )
    ptx = triton.compile(source, target=GPUTarget("cuda", sm, 32)).asm["ptx"]
    ops = set(
        re.findall(r"^\s*(?:@%p\d+\s+)?((?:div|rcp|fma|mul|add|sub|cvt)[.\w]*)", ptx, re.MULTILINE)
    )
    # The only float arithmetic: products, each rounded once, and IEEE divisions.
    arithmetic = {op for op in ops if op.endswith((".f32", ".f16", ".bf16"))}
    arithmetic -= {op for op in arithmetic if op.startswith("cvt")}
    product = "mul.rn.ftz.f32" if native and fp8 else "mul.f32"
    assert arithmetic <= {product, "div.rn.f32"}, ops
    assert len(re.findall(r"\.ftz", ptx)) == len(re.findall(r"mul\.rn\.ftz\.f32", ptx)), ops
    if not (native and fp8):
        assert ".ftz" not in ptx
    conversions = {op for op in ops if op.startswith("cvt") and ("e4m3" in op or "e5m2" in op)}
    assert conversions == ({f"cvt.rn.satfinite.{fp8}x2.f32"} if fp8 and native else set()), ops
    assert ("div.rn.f32" in ops) == divides, ops


# --- tier 2: CUDA ----------------------------------------------------------------------

ON_GPU = pytest.mark.skipif(
    not (torch.cuda.is_available() and HAS_TRITON), reason="needs CUDA and triton"
)


@ON_GPU
@pytest.mark.parametrize("case", PLAN, ids=lambda c: c.id)
def test_gpu_kernels_match_lowp(case):
    failures = run_case(case, "cuda")
    assert not failures, "\n".join(failures[:20])


# Shapes with the real tiles, 1M elements: every input dtype at (1024, 1024); bfloat16
# at (16, 65536), rows longer than one pass, and at rank 3.
# DeepSeek-V3's tiles (float8_blockwise's operands) beside the small ones of the plan.
DEEPSEEK_TILES = [
    lowp.BlockScaling(block=b, pow2=p)
    for b in ((1, 128), (128, 1), (128, 128))
    for p in (False, True)
]
GPU_RANDOM = [
    (scheme, shape, hp_dtype)
    for scheme in _schemes() + DEEPSEEK_TILES
    for shape, hp_dtypes in (
        ((1024, 1024), ("float32", "bfloat16", "float16")),
        ((16, 65536), ("bfloat16",)),
        ((64, 128, 128), ("bfloat16",)),
    )
    for hp_dtype in hp_dtypes
    if not (getattr(scheme, "axis", -1) == 1 and len(shape) == 2)
]


@ON_GPU
@pytest.mark.parametrize(
    "scheme, shape, hp_dtype",
    GPU_RANDOM,
    ids=[f"{cases.scheme_id(s)}-{sh}-{d}" for s, sh, d in GPU_RANDOM],
)
def test_gpu_kernels_match_lowp_and_torch_on_1m_random_values(scheme, shape, hp_dtype):
    """Random magnitudes 1e-30 .. 1e30 (per element and per 16-run, so group maxima and
    the scale quotients span the range): Triton == lowp == the torch-ops path on CUDA."""
    dtype = cases.HP_DTYPES[hp_dtype]
    for chunk in (None, 16):
        with np.errstate(over="ignore"):
            x = cases.random_magnitudes(shape, seed=len(shape), chunk=chunk).astype(dtype)
        t = torch.from_numpy(_bits_of(x)).view(getattr(torch, hp_dtype)).cuda()
        with lowp_torch.cast_kernels("triton"):
            fast = lowp_torch.quantize(t, scheme)
        with lowp_torch.cast_kernels("torch"):
            slow = lowp_torch.quantize(t, scheme)
        ref = _reference(x, scheme)
        problems = _differences(x, ref, fast)
        problems += [f"torch path: {p}" for p in _differences(x, ref, slow)]
        assert not problems, "\n".join(problems)


@ON_GPU
@pytest.mark.parametrize(
    "scheme",
    [lowp.TensorScaling(), lowp.AxisScaling(pow2=True), lowp.MXScaling(mode="rceil")],
    ids=cases.scheme_id,
)
def test_gpu_both_orientations_match_lowp_on_1m_random_values(scheme):
    from lowp_torch import _triton_casts

    x = cases.random_magnitudes((1024, 1024), seed=5, chunk=16).astype(cases.HP_DTYPES["bfloat16"])
    t = torch.from_numpy(_bits_of(x)).view(torch.bfloat16).cuda()
    rows, cols = _triton_casts.quantize_both(t, scheme)
    problems = _differences(x, _reference(x, scheme), rows)
    problems += _differences(x, _reference(x, scheme.permuted((1, 0))), cols)
    assert not problems, "\n".join(problems)


@ON_GPU
def test_eager_cuda_quantize_runs_the_triton_kernels_and_says_so(caplog):
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    with caplog.at_level("DEBUG", logger="lowp_torch"):
        lowp_torch.quantize(x, lowp.MXScaling(mode="rceil"), name="x")
        lowp_torch.quantize(x, lowp.NVFP4Scaling(), name="y")
    assert "x: quantize with MXScaling" in caplog.text and "on the Triton kernels" in caplog.text
    assert "y: quantize on torch ops: no Triton kernel for NVFP4Scaling" in caplog.text


# --- tier 3: dispatch -------------------------------------------------------------------


def _problem(t, scheme, **kwargs):
    call = {
        "rounding": "nearest",
        "random_bits": None,
        "seed": None,
        "offset": 0,
        "check_finite": False,
    }
    call.update(kwargs)
    return _cast_kernels.triton_problem(t, scheme, **call)


@pytest.mark.parametrize(
    "scheme, kwargs, reason",
    [
        (lowp.TensorScaling(), {}, "not CUDA"),
        (lowp.TensorScaling(), {"forced": True}, "not CUDA"),
    ],
)
def test_cpu_tensors_take_the_torch_path(scheme, kwargs, reason):
    assert reason in _problem(torch.ones(4, 32), scheme, **kwargs)


@pytest.mark.skipif(not HAS_TRITON, reason=NO_TRITON)
@pytest.mark.parametrize(
    "scheme, kwargs, reason",
    [
        (lowp.TensorScaling(), {"rounding": "stochastic", "seed": 1}, "stochastic"),
        (lowp.TensorScaling(), {"check_finite": True}, "check_finite"),
        (lowp.TensorScaling("float6_e2m3fn"), {}, "float6_e2m3fn"),
        (lowp.MXScaling("float4_e2m1fn"), {}, "float4_e2m1fn"),
        (lowp.BlockScaling("float4_e2m1fn"), {}, "float4_e2m1fn"),
        (lowp.NVFP4Scaling(), {}, "NVFP4Scaling"),
        (lowp.MXScaling(block=16, axis=0), {}, "shape"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_what_the_triton_path_does_not_run_is_named(scheme, kwargs, reason):
    with unittest.mock.patch.object(_cast_kernels, "_interpreting", return_value=True):
        t = torch.ones(4, 32)
        assert reason in _problem(t, scheme, forced=True, **kwargs)
        assert _problem(t, lowp.MXScaling(mode="rceil"), forced=True) is None


def test_non_power_of_two_mx_blocks_are_named():
    assert "power of two" in _cast_kernels.scheme_problem(lowp.MXScaling(block=24))


@pytest.mark.parametrize("t", [np.ones(3, np.float32), torch.ones(3, dtype=torch.float64)])
def test_other_inputs_take_the_torch_path_which_refuses_them(t):
    assert "not a dense float32/bfloat16/float16 tensor" in _problem(t, lowp.TensorScaling())
    with pytest.raises(TypeError):
        lowp_torch.quantize(t, lowp.TensorScaling())


def test_forcing_triton_where_it_cannot_run_names_the_reason():
    with lowp_torch.cast_kernels("triton"), pytest.raises(ValueError, match="x: .*not CUDA"):
        lowp_torch.quantize(torch.ones(4), lowp.TensorScaling(), name="x")


def test_unknown_cast_kernels_mode_is_refused():
    with pytest.raises(ValueError, match="'fast'"), lowp_torch.cast_kernels("fast"):
        pass


def test_the_mode_is_restored_after_the_block():
    with lowp_torch.cast_kernels("torch"):
        with lowp_torch.cast_kernels("triton"):
            assert _cast_kernels._MODE[0] == "triton"
        assert _cast_kernels._MODE[0] == "torch"
    assert _cast_kernels._MODE[0] == "auto"


def test_blocks_of_two_threads_may_exit_in_any_order():
    """Thread A opens "torch", thread B opens "triton", A exits first: B's block still
    holds "triton" (restoring A's saved "auto" would end it early), and after both, "auto"."""
    steps = [threading.Event() for _ in range(4)]
    seen = []

    def thread_a():
        with lowp_torch.cast_kernels("torch"):
            steps[0].set()
            steps[1].wait()
        seen.append(("a exited", _cast_kernels._MODE[0]))
        steps[2].set()

    def thread_b():
        steps[0].wait()
        with lowp_torch.cast_kernels("triton"):
            steps[1].set()
            steps[2].wait()
            seen.append(("b open", _cast_kernels._MODE[0]))

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert seen == [("a exited", "triton"), ("b open", "triton")]
    assert _cast_kernels._MODE[0] == "auto"


def test_the_mode_reaches_other_threads():
    """A CUDA backward runs in the autograd engine's device thread: the block's mode must
    hold there too (a ContextVar did not: the H200 run of the training test caught it)."""
    seen = []
    with lowp_torch.cast_kernels("torch"):
        worker = threading.Thread(target=lambda: seen.append(_cast_kernels._MODE[0]))
        worker.start()
        worker.join()
    assert seen == ["torch"]


def test_compiled_code_takes_the_mode_traced_with():
    """While tracing, the mode decides as in eager code: "torch" keeps the torch ops
    (for Inductor), and "auto" never takes the Triton casts for a CPU tensor (the
    compiled CUDA path is `test_compiled_code_calls_the_triton_casts_as_custom_ops`)."""
    tracing = unittest.mock.patch.object(torch.compiler, "is_compiling", return_value=True)
    kwargs = {
        "rounding": "nearest",
        "random_bits": None,
        "seed": None,
        "offset": 0,
        "check_finite": False,
    }
    for mode in ("torch", "auto"):
        with tracing, lowp_torch.cast_kernels(mode):
            assert not _cast_kernels.use_triton(
                torch.ones(4), lowp.TensorScaling(), name="x", **kwargs
            )


def _run_interpreted(code: str, timeout: int):
    """Run `code` in a subprocess under the Triton interpreter (TRITON_INTERPRET is read
    when a kernel is defined, so it cannot be switched on here); the JSON of its last
    line of output."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [env.get("PYTHONPATH")] if p])
    run = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


# --- the transposed-codes copy (`_cast_kernels.contiguous`, `_triton_transpose`) --------

# Transposed shapes (rows, cols) of the view: partial tiles on either side, a few bytes up
# to several 64 x 64 tiles (a 1 x 1 view is already contiguous: no copy to make).
TRANSPOSE_SHAPES = [(2, 3), (3, 5), (64, 64), (65, 130), (200, 17), (17, 300)]
_TRANSPOSE_CHECK = """
import json, torch, lowp_torch
from lowp_torch import _cast_kernels, _triton_transpose
bad, ran = [], []
for rows, cols in json.loads(SHAPES):
    for dtype in (torch.uint8, torch.float8_e4m3fn, torch.float8_e5m2):
        base = torch.randint(0, 256, (cols, rows), dtype=torch.uint8).view(dtype)
        view = base.t()  # (rows, cols), strides (1, rows)
        calls = []
        real = _triton_transpose.contiguous_transposed
        _triton_transpose.contiguous_transposed = lambda t: calls.append(1) or real(t)
        with lowp_torch.cast_kernels("triton"):
            got = _cast_kernels.contiguous(view)
        _triton_transpose.contiguous_transposed = real
        ran.append(bool(calls))
        same = got.is_contiguous() and got.dtype == dtype and got.shape == view.shape
        if not same or not torch.equal(got.view(torch.uint8), view.contiguous().view(torch.uint8)):
            bad.append([rows, cols, str(dtype)])
print(json.dumps({"bad": bad, "ran": ran}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TRITON, reason=NO_TRITON)
def test_transposed_codes_copy_is_the_bytes_of_contiguous():
    """Under the interpreter, the tile kernel's copy of a transposed byte tensor equals
    `.contiguous()` byte for byte, for every shape (partial tiles too) and byte dtype,
    and the kernel really ran."""
    code = f"SHAPES = {json.dumps(json.dumps(TRANSPOSE_SHAPES))}\n" + _TRANSPOSE_CHECK
    result = _run_interpreted(code, timeout=300)
    assert result["bad"] == []
    assert all(result["ran"]) and len(result["ran"]) == 3 * len(TRANSPOSE_SHAPES)


@pytest.mark.skipif(not (HAS_TRITON and torch.cuda.is_available()), reason="needs CUDA and triton")
@pytest.mark.parametrize("shape", [(8192, 4096), (4097, 1000), (64, 16384)])
def test_cuda_transposed_codes_copy_is_the_bytes_of_contiguous(shape):
    rows, cols = shape
    view = torch.randint(0, 256, (cols, rows), dtype=torch.uint8, device="cuda").t()
    got = _cast_kernels.contiguous(view.view(torch.float8_e4m3fn))
    assert got.is_contiguous() and got.dtype == torch.float8_e4m3fn
    assert torch.equal(got.view(torch.uint8), view.contiguous())


def test_contiguous_leaves_other_tensors_to_torch():
    """What is not a transposed 2-D byte tensor gets `.contiguous()`: a row slice, a
    wider dtype, 3-D, or any input under cast_kernels("torch")."""
    base = torch.arange(64, dtype=torch.uint8).reshape(8, 8)
    cases = [base[:, ::2], base.float().t(), base.reshape(2, 4, 8).transpose(1, 2)]
    with (
        unittest.mock.patch(
            "lowp_torch._triton_transpose.contiguous_transposed", side_effect=AssertionError
        )
        if HAS_TRITON
        else contextlib.nullcontext()
    ):
        for t in cases:
            assert torch.equal(_cast_kernels.contiguous(t), t.contiguous())
        with lowp_torch.cast_kernels("torch"):
            assert torch.equal(_cast_kernels.contiguous(base.t()), base.t().contiguous())


if __name__ == "__main__":
    _interpreter_main(int(sys.argv[1]))


# --- under torch.compile: the custom ops ------------------------------------------------

_COMPILED_CHECK = """
import json
import torch
import lowp, lowp_torch
from lowp_torch import _triton_casts

torch.manual_seed(0)
x = (torch.randn(64, 96) * torch.logspace(-3, 3, 96)).to(torch.bfloat16)
x[3, 5] = float("nan")  # one poisoned group per scheme
launches = []
for name in ("_launch", "_launch_both", "_launch_transposed"):
    real = getattr(_triton_casts, name)
    def counting(*args, _real=real, _name=name, **kwargs):
        launches.append(_name)
        return _real(*args, **kwargs)
    setattr(_triton_casts, name, counting)


def as_bytes(t):
    return t.reshape(-1).contiguous().view(torch.uint8)


def quantize(t, scheme):
    q = lowp_torch.quantize(t, scheme)
    return as_bytes(q.codes), as_bytes(q.scale)


def quantize_transposed(t, scheme):  # a stacked weight's w.T, read in place
    return quantize(t.reshape(2, 32, 96).transpose(-2, -1), scheme)


def quantize_both(t, scheme):
    rows, cols = _triton_casts.quantize_both(t, scheme)
    return as_bytes(rows.codes), as_bytes(rows.scale), as_bytes(cols.codes.t()), as_bytes(cols.scale)


results = []
schemes = [
    lowp.TensorScaling(),
    lowp.AxisScaling(pow2=True),
    lowp.AxisScaling("float8_e5m2", axis=0),
    lowp.MXScaling(mode="rceil"),
    lowp.MXScaling(mode="floor", axis=0),
]
calls = [(quantize, s) for s in schemes] + [
    (quantize_both, lowp.TensorScaling()),
    (quantize_both, lowp.AxisScaling(pow2=True)),
    (quantize_both, lowp.MXScaling(mode="rceil")),
    (quantize_transposed, lowp.AxisScaling(pow2=True)),
    (quantize_transposed, lowp.MXScaling(mode="rceil")),
]
with lowp_torch.cast_kernels("triton"):
    for fn, scheme in calls:
        eager = fn(x, scheme)
        del launches[:]
        torch._dynamo.reset()  # one code object compiled per call: no recompile limit
        # the scheme is a constant of the compiled code, as a layer's recipe is
        bound = (lambda fn, scheme: lambda t: fn(t, scheme))(fn, scheme)
        compiled = torch.compile(bound, fullgraph=True, dynamic=False, backend="aot_eager")(x)
        same = all(torch.equal(a, b) for a, b in zip(eager, compiled, strict=True))
        results.append([fn.__name__, repr(scheme), same, list(launches)])
    # A quantize_'d model: its weight's dispatch quantizes the input on fake tensors
    # while compiling (no launch there), which must not trip the forced mode.
    model = torch.nn.Sequential(torch.nn.Linear(64, 32))
    lowp_torch.quantize_(model, "float8_rowwise")
    x32 = torch.randn(8, 64)
    eager = model(x32)
    compiled = torch.compile(model, backend="aot_eager", dynamic=False)(x32)
    results.append(["inference_model", "float8_rowwise", bool(torch.equal(eager, compiled)), []])
print(json.dumps(results))
"""


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TRITON, reason=NO_TRITON)
def test_compiled_code_calls_the_triton_casts_as_custom_ops():
    """Under torch.compile(fullgraph=True) the casts trace as `lowp::triton_quantize`,
    `lowp::triton_quantize_transposed` and `lowp::triton_quantize_both` (no graph break), and the compiled function launches the
    same kernels at run time, with the eager bytes: under the interpreter, on CPU. A
    compiled quantize_'d model under the forced mode runs too (its fake-tensor dispatch
    once raised)."""
    results = _run_interpreted(_COMPILED_CHECK, timeout=600)
    assert len(results) == 11
    for fn, scheme, same, launches in results:
        assert same, f"{fn} {scheme}: compiled bytes differ from eager"
        if fn != "inference_model":
            want = {"quantize_both": "_launch_both", "quantize_transposed": "_launch_transposed"}
            want = want.get(fn, "_launch")
            assert launches == [want], f"{fn} {scheme}: launches {launches}"


def test_custom_op_fakes_match_the_launches():
    """The fake implementations (what torch.compile traces with) give the shapes and
    dtypes the launches return, for each scheme kind: checked on meta tensors against
    an eager run under the torch ops' scale shapes."""
    from lowp_torch import _cast_ops

    x = torch.empty(64, 96, dtype=torch.bfloat16, device="meta")
    for scheme, scale in [
        (lowp.TensorScaling(), ((), torch.float32)),
        (lowp.AxisScaling(), ((64,), torch.float32)),
        (lowp.AxisScaling(axis=0), ((96,), torch.float32)),
        (lowp.MXScaling(), ((64 * 3,), torch.uint8)),
        (lowp.MXScaling(axis=0), ((2 * 96,), torch.uint8)),
    ]:
        codes, got = torch.ops.lowp.triton_quantize(x, _cast_ops.scheme_key(scheme))
        assert (codes.shape, codes.dtype) == (x.shape, torch.uint8)
        assert (tuple(got.shape), got.dtype) == scale, scheme
    rows, row_scale, cols, col_scale = torch.ops.lowp.triton_quantize_both(
        x, _cast_ops.scheme_key(lowp.MXScaling())
    )
    assert rows.shape == (64, 96) and cols.shape == (96, 64)
    assert row_scale.shape == (64 * 3,) and col_scale.shape == (2 * 96,)
    rows, row_scale, cols, col_scale = torch.ops.lowp.triton_quantize_both(
        x, _cast_ops.scheme_key(lowp.TensorScaling())
    )
    assert rows.shape == (64, 96) and cols.shape == (96, 64)
    assert row_scale.shape == col_scale.shape == () and col_scale.dtype == torch.float32
    w = torch.empty(4, 64, 96, dtype=torch.bfloat16, device="meta")  # read as w.T (4, 96, 64)
    for scheme, scale in [
        (lowp.AxisScaling(), ((4 * 96,), torch.float32)),
        (lowp.MXScaling(), ((4 * 96 * 2,), torch.uint8)),
    ]:
        codes, got = torch.ops.lowp.triton_quantize_transposed(w, _cast_ops.scheme_key(scheme))
        assert (codes.shape, codes.dtype) == ((4, 96, 64), torch.uint8)
        assert (tuple(got.shape), got.dtype) == scale, scheme


@pytest.mark.slow
def test_the_custom_ops_exist_once_lowp_torch_is_imported():
    """A saved exported program that calls them loads in a fresh process after `import
    lowp_torch`: the ops are registered there, not when the Triton casts first run."""
    code = (
        "import json, sys, torch, lowp_torch\n"
        "names = ('triton_quantize', 'triton_quantize_transposed', 'triton_quantize_both')\n"
        "ops = [hasattr(torch.ops.lowp, n) for n in names]\n"
        "print(json.dumps([all(ops), 'lowp_torch._triton_casts' in sys.modules]))"
    )
    assert _run_interpreted(code, timeout=300) == [True, False]


# --- the inline ops (`_cast_ops`: triton_ops whose launches Inductor makes) -------------

_CAST_KERNELS = ["tensor_amax_kernel", "tensor_cast_kernel", "tensor_cast_2d_kernel"]
_CAST_KERNELS += ["axis_rows_kernel"]
_CAST_KERNELS += ["block_tiles_kernel", "axis_cast_2d_kernel", "axis_amax_2d_kernel"]
_CAST_KERNELS += ["mx_2d_kernel"]


@pytest.mark.skipif(not HAS_TRITON, reason=NO_TRITON)
@pytest.mark.parametrize("name", _CAST_KERNELS)
def test_inline_kernels_source_inductor_rebuilds_defines_every_helper(name):
    """Under torch.compile an inline op's kernels are launched by Inductor, which rebuilds
    each kernel's source from the JIT functions its globals name (a helper it leaves out
    fails only on a GPU, in its compile worker): every JIT function of `_triton_kernels`
    a kernel calls is defined in its rebuilt source."""
    import triton
    from torch._inductor.codegen.wrapper import (
        user_defined_triton_kernel_transitive_closure_source_code as rebuilt_source,
    )

    from lowp_torch import _triton_kernels as K

    jits = {n for n in dir(K) if isinstance(getattr(K, n), triton.runtime.jit.JITFunction)}
    source = rebuilt_source(getattr(K, name))
    defined = set(re.findall(r"^def (\w+)\(", source, re.MULTILINE))
    called = set(re.findall(r"\b(\w+)\(", source)) & jits
    assert name in defined and called <= defined, called - defined


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TRITON, reason=NO_TRITON)
@pytest.mark.parametrize("variant", [v for v in PTX_VARIANTS if not v.startswith("grouped")])
def test_inline_kernels_rebuilt_source_compiles_to_the_same_ptx(variant, tmp_path):
    """The kernels Inductor rebuilds for an inline op compile for sm_90 to the PTX of the
    kernels the eager casts launch (source locations aside): the same bytes, whoever
    launches them."""
    import importlib.util

    import triton
    from torch._inductor.codegen.wrapper import (
        user_defined_triton_kernel_transitive_closure_source_code as rebuilt_source,
    )
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel, signature, constexprs, _, _ = _ptx_variants(native=True)[variant]
    path = tmp_path / f"rebuilt_{variant.replace('-', '_')}.py"
    header = "import triton\nimport triton.language as tl\n\n@triton.jit\n"
    path.write_text(header + rebuilt_source(kernel))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def ptx(fn):
        source = ASTSource(
            fn=fn,
            signature=signature | dict.fromkeys(constexprs, "constexpr"),
            constexprs=constexprs,
        )
        text = triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
        code = text.split("\t.section\t.debug")[0]  # the debug sections name the files
        return [ln for ln in code.splitlines() if not ln.lstrip().startswith((".loc", ".file"))]

    assert ptx(getattr(module, kernel.__name__)) == ptx(kernel)


def test_traced_op_takes_the_inline_op_where_it_launches_through_inductor():
    """`traced_op` picks `lowp::<name>_inline` for the ops of INLINE_NAMES where they
    are triton_ops (Triton on a GPU), else the opaque op; every name exists either way."""
    from lowp_torch import _cast_ops

    assert _cast_ops.INLINE_NAMES == ("triton_quantize_both",)
    for inline in (True, False):
        with unittest.mock.patch.object(_cast_ops, "INLINE", inline):
            for name in _cast_ops.NAMES:
                takes = inline and name in _cast_ops.INLINE_NAMES
                want = name + "_inline" if takes else name
                assert _cast_ops.traced_op(name) is getattr(torch.ops.lowp, want)
    assert hasattr(torch.ops.lowp, "triton_quantize_both_inline")


def _bound(kernel, args, kwargs) -> dict:
    """A launch's arguments by name (the positional ones lead, the rest by keyword)."""
    return dict(zip(kernel.arg_names[: len(args)], args, strict=True)) | kwargs


@pytest.mark.skipif(not HAS_TRITON, reason=NO_TRITON)
@pytest.mark.parametrize(
    "scheme", [lowp.AxisScaling(), lowp.AxisScaling("float8_e5m2", pow2=True), lowp.MXScaling()]
)
def test_inline_body_traces_to_the_direct_launches(scheme, monkeypatch):
    """Traced (make_fx, fake tensors, as torch.compile traces a triton_op's body), the
    inline op's body records each kernel launch as a `wrap_triton` node with the grid and
    arguments of the launches the opaque op makes (recorded here with stubbed kernels):
    the same kernels on the same buffers, whoever launches them."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
    from torch.fx.experimental.proxy_tensor import make_fx

    from lowp_torch import _cast_ops
    from lowp_torch import _triton_kernels as K

    def describe(kernel, grid, arguments):
        values = {
            k: ("tensor", tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else v
            for k, v in arguments.items()
            if k not in ("num_warps", "num_stages")
        }
        return kernel.fn.__name__, tuple(grid) + (1,) * (3 - len(grid)), values

    x = torch.randn(64, 96, dtype=torch.bfloat16)
    key = _cast_ops.scheme_key(scheme)
    gm = make_fx(lambda t: _cast_ops._inline("triton_quantize_both")(t, key), tracing_mode="fake")(
        x
    )
    traced = []
    for node in gm.graph.nodes:
        if "triton_kernel_wrapper" in str(node.target):
            kernel = kernel_side_table.get_kernel(node.kwargs["kernel_idx"])
            constants = kernel_side_table.get_constant_args(node.kwargs["constant_args_idx"])
            arguments = {
                k: v.meta["val"] if isinstance(v, torch.fx.Node) else v
                for k, v in node.kwargs["kwargs"].items()
            }
            traced.append(describe(kernel, node.kwargs["grid"][0], arguments | constants))

    direct = []

    class Recorder:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                direct.append(describe(self.kernel, grid, _bound(self.kernel, args, kwargs)))

            return launch

    for name in ("axis_amax_2d_kernel", "axis_cast_2d_kernel", "mx_2d_kernel"):
        monkeypatch.setattr(K, name, Recorder(getattr(K, name)))
    _cast_ops._quantize_both(x, key)
    assert direct and traced == direct


@pytest.mark.skipif(not HAS_TRITON, reason=NO_TRITON)
def test_inline_body_with_a_symbolic_shape_calls_the_opaque_op():
    """Traced with symbolic dims (dynamic shapes, export's dims), the inline op's body
    calls the opaque op instead of launching: the launch parameters would pin the dims."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from lowp_torch import _cast_ops

    key = _cast_ops.scheme_key(lowp.AxisScaling())
    gm = make_fx(
        lambda t: _cast_ops._inline("triton_quantize_both")(t, key), tracing_mode="symbolic"
    )(torch.randn(64, 96, dtype=torch.bfloat16))
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert "lowp.triton_quantize_both.default" in targets, targets
    assert not any("triton_kernel_wrapper" in t for t in targets), targets
    outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    assert any(isinstance(d, torch.SymInt) for d in outputs[0].meta["val"].shape)


@ON_GPU
def test_cuda_compiled_casts_launch_inline_with_the_eager_bytes():
    """On a GPU, torch.compile's casts write the eager bytes, for each launch function
    and scheme kind; `quantize_both` is the inline op, whose kernels the compiled code
    launches itself (no opaque `lowp::triton_quantize_both` call in it)."""
    from torch._inductor.utils import run_and_get_code

    from lowp_torch import _triton_casts

    torch.manual_seed(0)
    x = (torch.randn(64, 96) * torch.logspace(-3, 3, 96)).to(torch.bfloat16).cuda()
    x[3, 5] = float("nan")

    def as_bytes(*ts):
        return [t.reshape(-1).contiguous().view(torch.uint8) for t in ts]

    def quantize(t, scheme):
        q = lowp_torch.quantize(t, scheme)
        return as_bytes(q.codes, q.scale)

    def quantize_transposed(t, scheme):  # a stacked weight's w.T, read in place
        return quantize(t.reshape(2, 32, 96).transpose(-2, -1), scheme)

    def quantize_both(t, scheme):
        rows, cols = _triton_casts.quantize_both(t, scheme)
        return as_bytes(rows.codes, rows.scale, cols.codes.t(), cols.scale)

    cases = [
        (quantize, lowp.TensorScaling()),
        (quantize, lowp.AxisScaling(pow2=True)),
        (quantize, lowp.AxisScaling("float8_e5m2", axis=0)),
        (quantize, lowp.MXScaling()),
        (quantize, lowp.BlockScaling(block=(16, 32))),
        (quantize_both, lowp.TensorScaling()),
        (quantize_both, lowp.AxisScaling()),
        (quantize_both, lowp.MXScaling()),
        (quantize_transposed, lowp.AxisScaling()),
        (quantize_transposed, lowp.MXScaling()),
    ]
    for fn, scheme in cases:
        eager = fn(x, scheme)
        torch._dynamo.reset()
        compiled = torch.compile(
            functools.partial(fn, scheme=scheme), fullgraph=True, dynamic=False
        )
        got, code = run_and_get_code(compiled, x)
        if fn is quantize_both:
            assert "triton_quantize_both.default" not in "\n".join(code), str(scheme)
        for a, b in zip(eager, got, strict=True):
            assert torch.equal(a, b), f"{fn.__name__} {scheme}: compiled bytes differ"
