"""The element step's rounding (spec §4): nearest-even, or stochastic from uint32 bits.

The random bits are uint32 values carried in int64 tensors: torch lacks most uint32
operations on CPU, and int64 holds every intermediate of the hash exactly.
"""

import numpy as np
import torch

import lowp
from lowp_torch import _bits, _encode

_MASK32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for x in [0, 2**32) (int64) and a constant c < 2**32.

    x * c itself can reach 2**64 and overflow int64 (undefined behaviour in the C++ and
    Triton code Inductor writes), so c is split into 16-bit halves: each partial
    product stays below 2**48.
    """
    low, high = c & 0xFFFF, c >> 16
    return (x * low + (((x * high) & 0xFFFF) << 16)) & _MASK32


def random_bits(seed: int, shape, offset: int = 0, *, device=None) -> torch.Tensor:
    """One uint32 per element of `shape`, as int64: exactly `lowp.random_bits`.

    The hash of spec §4 of each element's flat C-order index, computed on `device`.

    Args:
      seed: any int, taken mod 2**32.
      shape: the shape of the tensor as passed to quantize.
      offset: added to each index (mod 2**32); an int, or a 0-d int64 tensor holding a
        value computed on the device (the training recipes' data offsets, spec §8).
      device: where to make the bits (default: the CPU).

    Returns:
      An int64 tensor of `shape` holding values in [0, 2**32).

    >>> random_bits(0, (3,)).tolist()
    [0, 1684164658, 3653269916]
    """
    tensor_offset = (
        isinstance(offset, torch.Tensor) and offset.dtype == torch.int64 and offset.dim() == 0
    )
    for field, value in (("seed", seed), ("offset", offset)):
        if field == "offset" and tensor_offset:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"random_bits: {field} must be an int, got {value!r}")
    seed = int(seed)
    offset = offset if tensor_offset else int(offset)
    shape = (int(shape),) if isinstance(shape, int) else tuple(int(n) for n in shape)
    count = 1
    for n in shape:
        count *= n
    index = (torch.arange(count, dtype=torch.int64, device=device) + (offset & _MASK32)) & _MASK32
    x = (_mul32(index, 0x9E3779B9) + (seed & _MASK32)) & _MASK32
    x = x ^ (x >> 16)  # x >= 0, so >> is the logical shift of the spec
    x = _mul32(x, 0x21F0AAAD)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x735A2D97)
    x = x ^ (x >> 15)
    return x.reshape(shape)


def round_elements(v: torch.Tensor, fmt: lowp.Format, random: torch.Tensor | None) -> torch.Tensor:
    """uint8 codes for float32 `v`, already clamped to ±fmt.max and flushed.

    `random` is None for round-to-nearest-even, else an int64 tensor of uint32 values,
    one per element. Every float operation below is exact (products by powers of two,
    floor, the fraction), so no contraction or reassociation can change a bit.
    """
    if random is None:
        return _encode.encode(v, fmt)
    b = _bits.bits(v)
    sign = b & _bits.SIGN
    a = _bits.from_bits(b & _bits.ABS)
    e = torch.clamp(_bits.biased_exponent(b) - 127, min=1 - fmt.bias)
    t = a * _bits.pow2(fmt.mbits - e)  # exact
    n = torch.floor(t)
    f = t - n  # exact
    fraction24 = torch.floor(f * float(1 << 24)).to(torch.int64)  # exact, < 2**24
    up = (fraction24 + (random >> 8)) >= (1 << 24)
    q = (n + up.to(torch.float32)) * _bits.pow2(e - fmt.mbits)  # exact
    q = torch.clamp(q, max=fmt.max)
    return _encode.encode(_bits.from_bits(_bits.bits(q) | sign), fmt)
