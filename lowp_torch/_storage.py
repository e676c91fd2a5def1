"""How codes and scales are stored: torch's native low-precision dtypes.

Codes are `float8_e4m3fn` / `float8_e5m2` views of the uint8 codes, float6 codes stay
uint8 (one a byte; torch has no float6 dtype), float4 codes are `float4_e2m1fn_x2`
(two a byte, element 2j in bits 3..0). MX scales are `float8_e8m0fnu`, NVFP4 block
scales `float8_e4m3fn`, float scales and the global scale float32. The bytes are
always lowp's; the dtype only labels them.
"""

import torch
from torch._subclasses.fake_tensor import is_fake

CODE_DTYPES = {
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
    "float6_e2m3fn": torch.uint8,
    "float6_e3m2fn": torch.uint8,
    "float4_e2m1fn": torch.float4_e2m1fn_x2,
}
SCALE_DTYPES = {
    "float32": torch.float32,
    "float8_e8m0fnu": torch.float8_e8m0fnu,
    "float8_e4m3fn": torch.float8_e4m3fn,
}
HP_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
# Canonical NaN bit patterns lowp writes (spec §1), as the signed ints of the same width.
CANONICAL_NAN_BITS = {torch.float32: 0x7FC00000, torch.bfloat16: 0x7FC0, torch.float16: 0x7E00}
SAME_WIDTH_INT = {
    torch.float32: torch.int32,
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
}

# Inductor has no C++ or Triton type for these two (torch 2.13 CPU: "float8_e8m0fnu
# missing from DTYPE_TO_CPP", "KeyError: torch.float4_e2m1fn_x2"): a kernel can neither
# write nor read a buffer of them, even through a bitcast view. Under torch.compile the
# relabelling therefore goes through an opaque custom op (a byte copy, run eagerly); in
# eager mode it is a plain view.
_OPAQUE_DTYPES = (torch.float8_e8m0fnu, torch.float4_e2m1fn_x2)


@torch.library.custom_op("lowp_torch::reinterpret_bytes", mutates_args=())
def _reinterpret_bytes(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # A copy (a custom op may not return a view of its input), made as uint8 so it needs
    # no kernel for the low-precision dtype.
    return t.view(torch.uint8).clone().view(dtype)


@_reinterpret_bytes.register_fake
def _(t, dtype):
    return torch.empty_like(t, dtype=dtype)


def _relabel(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if t.dtype == dtype:
        return t
    if (t.dtype in _OPAQUE_DTYPES or dtype in _OPAQUE_DTYPES) and traced(t):
        return _reinterpret_bytes(t, dtype)
    return t.view(dtype)


def traced(t: torch.Tensor) -> bool:
    """Whether `t` is being traced for a compiled graph. Dynamo's flag alone misses the
    AOTAutograd trace of a tensor subclass's __torch_dispatch__ on torch 2.11 (there
    the tensors are fake, the flag is off, and Inductor later met a raw e8m0 buffer).

    A tensor of exactly `torch.Tensor`'s type that no functorch transform wraps (their
    C++ wrappers also have that type) is neither fake nor a wrapper of fake tensors, so
    it skips `is_fake`, which costs 4-25 us a call in eager CPU inference
    (docs/performance.md, CPU inference)."""
    if torch.compiler.is_compiling():
        return True
    if type(t) is torch.Tensor and not torch._C._functorch.is_functorch_wrapped_tensor(t):
        return False
    return is_fake(t)


def as_stored(u8: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The uint8 tensor `u8` relabelled as `dtype` (one byte an element), bytes unchanged."""
    return _relabel(u8, dtype)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a one-byte-an-element tensor, as uint8."""
    return _relabel(t, torch.uint8)
