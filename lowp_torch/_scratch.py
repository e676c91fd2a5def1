"""Slab buffers and constants that an eager CPU `quantize` reuses from slab to slab.

A tensor allocated afresh for each slab is paged in again each time (the allocator
hands a freed slab-sized block back to the kernel), which on a CPU costs more than the
integer op that fills it: the host element step (`_encode.nearest_codes_on_host`,
`_rounding.stochastic_codes_on_host`) writes every intermediate into these buffers
with `out=` and in-place ops instead. Its constant operands are 0-d tensors of the
operand's dtype: ATen wraps a Python number into a fresh tensor and converts it at
every call, 2-6 us an op (torch 2.13, one thread), a few dozen ops a slab.
"""

import math

import torch


class Scratch:
    """Named flat buffers, grown to the largest slab asked for. `take` returns a view
    of the first elements of one, valid until the next `take` of the same name."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}
        self._views: dict[tuple, torch.Tensor] = {}
        self._index_products = torch.zeros(0, dtype=torch.int32)
        self._constants: dict[tuple, torch.Tensor] = {}

    def take(self, name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        view = self._views.get((name, dtype, shape))
        if view is not None:  # the slabs of a call mostly share one shape
            return view
        size = math.prod(shape)
        buffer = self._buffers.get(name)
        if buffer is None or buffer.dtype != dtype or buffer.numel() < size:
            buffer = self._buffers[name] = torch.empty(size, dtype=dtype)
            self._views = {key: v for key, v in self._views.items() if key[0] != name}
        view = self._views[(name, dtype, shape)] = buffer[:size].view(shape)
        return view

    def constant(self, value, dtype: torch.dtype) -> torch.Tensor:
        """`value` as a 0-d tensor of `dtype` (made once), an operand ATen takes as is."""
        key = (value, dtype)
        tensor = self._constants.get(key)
        if tensor is None:
            tensor = self._constants[key] = torch.tensor(value, dtype=dtype)
        return tensor

    def index_products(self, count: int) -> torch.Tensor:
        """i * 0x9E3779B9 mod 2**32 as int32 for i = 0 .. count - 1: the first product of
        the random bits' hash (spec §4.2), the same for every slab (read-only)."""
        if self._index_products.numel() < count:
            products = torch.arange(count, dtype=torch.int32)
            products *= 0x9E3779B9 - (1 << 32)  # the int32 of the same bits: wraps alike
            self._index_products = products
        return self._index_products[:count]
