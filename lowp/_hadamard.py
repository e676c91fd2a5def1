"""The random Hadamard transform of NVFP4 training's weight-gradient operands (spec §8).

The wgrad GEMM `dw = g.T @ x` reduces over the tokens M. Transformer Engine's NVFP4
recipe multiplies both of its operands, along M, by one orthonormal matrix
`Q = blockdiag(H16 D / 4, H16 D / 4, ...)`: `H16` the 16x16 Sylvester Hadamard matrix,
`D` the diagonal of a random sign vector `s`. Since `Q Q^T = I` the product is unchanged,
while each block's values are spread over its 16 elements, so an outlier no longer owns
its block's fp4 scale.

Everything here is defined so that every backend gets the same bits:

- the signs are a pure function of (seed, layer, shape) (`signs`), drawn with spec §4.2's
  counter hash, never with a framework's generator;
- the transform (`transform`) is the fast Walsh-Hadamard butterfly in a fixed order of
  float32 additions: elementwise IEEE adds and subtracts, each rounded once, each
  result flushed (spec §0.2), and a final exact multiplication by 1/4. The core gives
  the order; each backend runs it with its own array ops (`stack`, `ftz`).
"""

import zlib

import numpy as np

from lowp import _rounding

BLOCK = 16
_STAGES = 4  # log2(BLOCK)


def signs(seed: int, layer: str, shape: tuple[int, ...]) -> np.ndarray:
    """The sign vector `s` (16 float32 values, +1 or -1) of the transform in `layer` of
    operands reduced over `shape` (the wgrad's (M,): both operands must take the same
    signs for the product to stay g.T @ x): bit 31 of `lowp.random_bits(seed, (16,),
    offset=crc32(key))`, key the UTF-8 text `f"{layer}:{shape}"` (shape as a Python
    tuple of ints), set meaning -1.

    >>> signs(0, "", (64,)).tolist()[4:8]
    [1.0, -1.0, 1.0, 1.0]
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"hadamard signs: seed must be an int, got {seed!r}")
    if not isinstance(layer, str):
        raise TypeError(f"hadamard signs: layer must be a str, got {layer!r}")
    key = zlib.crc32(f"{layer}:{tuple(int(n) for n in shape)}".encode())
    bits = _rounding.random_bits(int(seed), (BLOCK,), offset=key)
    return np.where(bits >> np.uint32(31), np.float32(-1), np.float32(1)).astype(np.float32)


def check_shape(shape: tuple[int, ...], name: str = "input") -> None:
    """ValueError naming `name` unless the last axis is a positive multiple of 16."""
    if len(shape) == 0 or shape[-1] % BLOCK:
        raise ValueError(
            f"{name}: the Hadamard transform runs in blocks of {BLOCK} along the last axis, "
            f"which must be a multiple of {BLOCK}; got shape {tuple(shape)}"
        )


def transform(x, s, *, stack, ftz):
    """`x` (float32, any backend's array, last axis a multiple of 16) times
    `blockdiag(H16 diag(s) / 4)` along its last axis, in spec §8's order:

      u = x * s                                    (exact: sign flips)
      for h in 1, 2, 4, 8:                         pair i with i + h, for i & h == 0:
          u[i], u[i + h] = ftz(u[i] + u[i + h]), ftz(u[i] - u[i + h])
      y = ftz(u * 0.25)

    Args:
      x: the flushed float32 operand.
      s: `signs(...)` as the backend's float32 array of 16.
      stack: the backend's `stack(arrays, axis)`.
      ftz: the backend's flush of float32 subnormals to signed zero (spec §0.2).
    """
    shape = tuple(x.shape)
    check_shape(shape)
    lead = shape[:-1] + (shape[-1] // BLOCK,)
    u = ftz((x.reshape(lead + (BLOCK,)) * s).reshape(lead + (2,) * _STAGES))
    # index i = 8 b3 + 4 b2 + 2 b1 + b0 over the split axes (b3, b2, b1, b0): the pair
    # (i, i + h) differs in the bit of h, the split axis -1 for h = 1, ..., -4 for h = 8.
    for stage in range(_STAGES):
        axis = len(lead) + _STAGES - 1 - stage
        index = (slice(None),) * axis
        lo, hi = u[index + (0,)], u[index + (1,)]
        u = stack([ftz(lo + hi), ftz(lo - hi)], axis)
    return ftz(u.reshape(shape) * 0.25)


def transform_numpy(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    """`transform` in NumPy, the reference."""
    from lowp import _bits

    return transform(np.asarray(x, np.float32), s, stack=np.stack, ftz=_bits.ftz)


def matrix(s: np.ndarray) -> np.ndarray:
    """`H16 diag(s) / 4` as a float64 matrix (for tests: `transform` is `x @ matrix.T`
    up to float32 rounding)."""
    h = np.ones((1, 1))
    for _ in range(_STAGES):
        h = np.block([[h, h], [h, -h]])
    return h * s[None, :].astype(np.float64) / 4
