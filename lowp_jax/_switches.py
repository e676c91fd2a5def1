"""Process-wide settings that `with` blocks change and `jax.jit` keys on.

lowp_jax's switches (`lowp_jax.cast_kernels`, `lowp_jax.gemm_output`) are each a
`Switch`: product code reads `switch.value` when it traces a computation, and the
public context manager sets it for the duration of a `with` block.

The value is held in a `jax.make_user_context` object, so it is part of the trace
context every jit cache keys on: a `jax.jit` function called under another setting is
traced again instead of reusing a trace made under the old one, and the jitted
functions inside lowp_jax (`quantize` runs as one cached jit) do the same. What is
already compiled (`jax.jit(f).lower(...).compile()`) keeps the setting it was traced
under.

As in `lowp_torch.cast_kernels`, the setting is process-wide (the global value of the
user context, never a thread-local one), and blocks entered by several threads may
exit in any order: the value is that of the most recently entered block still open,
so one thread's exit never restores a value another thread's open block had replaced.
"""

import contextlib
import threading
from collections.abc import Hashable

import jax


class Switch:
    """One setting: `value` (read at trace time) and `setting(value)` (a `with` block)."""

    def __init__(self, default: Hashable):
        self.default = default
        self._context = jax.make_user_context(default)
        self._open: list[tuple[object, Hashable]] = []  # (block token, value), oldest first
        self._lock = threading.Lock()

    @property
    def value(self):
        """The current value: the newest open block's, else the default."""
        return self._context.value

    @contextlib.contextmanager
    def setting(self, value: Hashable):
        """Inside the block, `value` is the setting (and part of jit's cache key)."""
        token = object()
        with self._lock:
            self._open.append((token, value))
            self._context.set_global(value)
        try:
            yield
        finally:
            with self._lock:
                self._open[:] = [entry for entry in self._open if entry[0] is not token]
                self._context.set_global(self._open[-1][1] if self._open else self.default)
