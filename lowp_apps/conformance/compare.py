"""The byte comparison: a backend's outputs against the NumPy reference's, explained.

Everything is compared as raw bytes (NaN payloads, signed zeros and scale codes
included). A difference is described by the first differing element: its index, both
outputs in hex, and the input bits behind it — the element itself for codes and
dequantized values, the group's largest |x| for a scale, both elements of a packed
fp4 byte — so a mismatch can be reproduced from the message alone.
"""

import dataclasses

import numpy as np

import lowp
from lowp_apps.conformance import cases


@dataclasses.dataclass(frozen=True, eq=False)
class Outputs:
    """What a backend made of one input, converted to NumPy.

    Attributes:
      quantized: its quantize result as a lowp.QTensor (plain layout).
      dequantized: out_dtype name -> its dequantize of that result.
      blocked: the result with its scales in the cuBLAS layout, or None (not checked).
      blocked_dequantized: its dequantize of `blocked`, or None.
      unblocked: `blocked` converted back to the plain layout, or None.
      imported: its dequantize (input dtype) of the reference's bytes loaded into the
        backend, or None.
      alternates: kernel choice -> the Outputs of the same quantize + dequantize on
        other kernels of the backend (torch_cuda_compiled: Inductor's kernels of the
        torch ops beside the Triton casts), each checked as `got` is.
    """

    quantized: lowp.QTensor
    dequantized: dict
    blocked: lowp.QTensor | None = None
    blocked_dequantized: np.ndarray | None = None
    unblocked: lowp.QTensor | None = None
    imported: np.ndarray | None = None
    alternates: dict = dataclasses.field(default_factory=dict)


def differences(x: np.ndarray, ref: lowp.QTensor, got: Outputs) -> list[str]:
    """Every way `got` differs from the reference `ref` for input `x`: [] when identical."""
    mine = got.quantized
    problems = []
    for field in ("scheme", "shape", "hp_dtype", "scale_layout"):
        if getattr(mine, field) != getattr(ref, field):
            problems.append(f"{field}: got {getattr(mine, field)!r}, want {getattr(ref, field)!r}")
    if problems:
        return problems
    scheme = ref.scheme
    packed = scheme.fmt == "float4_e2m1fn"
    problems.append(
        first_difference(
            "codes", mine.codes, ref.codes, x, scheme, "packed" if packed else "elements"
        )
    )
    problems.append(first_difference("scale", mine.scale, ref.scale, x, scheme, "scale"))
    if (mine.global_scale is None) != (ref.global_scale is None):
        problems.append(f"global_scale: got {mine.global_scale!r}, want {ref.global_scale!r}")
    elif ref.global_scale is not None:
        problems.append(
            first_difference(
                "global_scale", mine.global_scale, ref.global_scale, x, scheme, "tensor"
            )
        )
    for out_dtype, out in got.dequantized.items():
        want = reference_dequantized(ref, out_dtype)
        problems.append(
            first_difference(f"dequantize->{out_dtype}", out, want, x, scheme, "elements")
        )
    if got.blocked is not None:
        want = ref.with_scale_layout("cublas_blocked")
        problems.append(
            first_difference("cublas_blocked scale", got.blocked.scale, want.scale, x, scheme, None)
        )
        problems.append(
            first_difference(
                "dequantize(cublas_blocked)",
                got.blocked_dequantized,
                reference_dequantized(want, ref.hp_dtype),
                x,
                scheme,
                "elements",
            )
        )
        problems.append(
            first_difference(
                "cublas_blocked -> plain scale", got.unblocked.scale, ref.scale, x, scheme, "scale"
            )
        )
    if got.imported is not None:
        want = reference_dequantized(ref, ref.hp_dtype)
        problems.append(
            first_difference(
                "dequantize(reference bytes)", got.imported, want, x, scheme, "elements"
            )
        )
    for kernels, alternate in got.alternates.items():
        problems += [f"[{kernels}] {p}" for p in differences(x, ref, alternate)]
    return [p for p in problems if p]


def reference_dequantized(ref: lowp.QTensor, out_dtype: str) -> np.ndarray:
    # A code times its scale may round past FLT_MAX to Inf (a group max near FLT_MAX
    # whose scale rounded up), as spec §3 says; NumPy then warns, which the project's
    # filterwarnings turns into an error. The value is right.
    with np.errstate(over="ignore"):
        return ref.dequantize(out_dtype)


def first_difference(label, got, want, x, scheme, role) -> str | None:
    """None if `got` and `want` hold identical bytes, else the first difference explained.

    role: "elements" (shaped like x), "packed" (fp4 codes, two a byte along the last
    axis), "scale" (plain scale shape: the group's largest |x| is shown), "tensor" (one
    value for the whole tensor), or None (no input shown: a layout of other values).
    """
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{label}: got shape {got.shape} {got.dtype}, want {want.shape} {want.dtype}"
    g, w = _as_uint(got), _as_uint(want)
    differ = g != w
    if not differ.any():
        return None
    index = tuple(int(i) for i in np.argwhere(differ)[0])
    digits = 2 * got.dtype.itemsize
    text = (
        f"{label}: {int(differ.sum())} of {differ.size} differ; first at index {index}: "
        f"got 0x{int(g[index]):0{digits}x}, want 0x{int(w[index]):0{digits}x}"
    )
    if role == "elements":
        notes = [_input_note(x, index)]
    elif role == "packed":
        lead, j = index[:-1], index[-1]
        notes = [_input_note(x, lead + (2 * j,)), _input_note(x, lead + (2 * j + 1,))]
    elif role in ("scale", "tensor"):
        notes = [_group_note(x, scheme, index if role == "scale" else None)]
    else:
        notes = []
    return "; ".join([text] + notes)


def _as_uint(a: np.ndarray) -> np.ndarray:
    """The bits of `a` as unsigned integers of its width, shape kept (0-d included)."""
    a = np.array(a, order="C", copy=None)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _input_note(x: np.ndarray, index) -> str:
    """`input[i] = 0xBITS (value)` in the input's own dtype."""
    v = x[tuple(index)]
    bits = int(_as_uint(np.asarray(v)))
    return (
        f"input[{tuple(int(i) for i in index)}] = 0x{bits:0{2 * x.dtype.itemsize}x} ({float(v)!r})"
    )


def _group_note(x: np.ndarray, scheme, scale_index) -> str:
    """The group's size and its largest |x| (which sets the scale), as input bits."""
    if scale_index is None:
        members = np.argwhere(np.ones(x.shape, bool))
    else:
        ids = cases.group_ids(x.shape, scheme)
        flat = (
            int(np.ravel_multi_index(scale_index, scheme.scale_shape(x.shape)))
            if scale_index
            else 0
        )
        members = np.argwhere(ids == flat)
    if not len(members):
        return "an empty group"
    magnitude = _as_uint(np.abs(x.astype(np.float32)))[tuple(members.T)]
    top = tuple(members[int(np.argmax(magnitude))])
    return f"group of {len(members)}, largest |x| at " + _input_note(x, top)
