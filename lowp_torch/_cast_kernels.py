"""Which kernels quantize a call: the fused Triton casts, or the torch-ops algorithm.

`lowp_torch.quantize` asks `use_triton` first. Both paths write the same bytes (the
Triton kernels are tested against `lowp.quantize` like every backend); the Triton one
is for speed in eager mode on CUDA (`_triton_casts`). It runs when every requirement
holds, and `triton_problem` names the first that does not:

- a float32 / bfloat16 / float16 torch.Tensor on a CUDA device, whose shape the
  scheme admits (else the torch path raises the error naming it). Under the Triton
  CPU interpreter (`TRITON_INTERPRET=1`, which the tests use) `cast_kernels("triton")`
  also runs the kernels on CPU tensors; "auto" never does;
- under torch.compile, the same: the compiled graph then calls the kernels through
  ops (`_cast_ops`: `torch.ops.lowp.triton_quantize`, `triton_quantize_both`, ...),
  without a graph break; on a GPU Inductor launches `quantize_both`'s kernels from its
  own code (`_cast_ops.INLINE_NAMES`), the others run as opaque ops. `cast_kernels("torch")` keeps the torch ops there instead, for
  Inductor to fuse with what produces the input;
- nearest rounding and `check_finite=False` (stochastic rounding and the finite check
  stay on the torch path);
- triton importable;
- a scheme the kernels implement: TensorScaling, AxisScaling (any axis), BlockScaling
  (any tile) or MXScaling (any axis, block a power of two) with a float8_e4m3fn /
  float8_e5m2 element format.

`cast_kernels("auto" | "triton" | "torch")` overrides the choice inside a `with`
block; tests and `bench/casts.py` use it to run each path on purpose. A context
manager rather than a keyword of `quantize` because the quantizations that matter for
speed happen inside layers (`Linear`, `quantize_`'d models) that a keyword cannot
reach; rather than an environment variable because it is scoped and undone on exit,
so a test cannot leak its choice into the next. `"triton"` raises where the Triton
path cannot run, naming the reason, instead of silently measuring the other path.

Which block holds in a thread: its own innermost open block, if it has one; else the
most recently entered block still open in any thread. The fallback is why the choice
is not a context variable: a CUDA backward runs in the autograd engine's own device
thread, which opens no block and which a `contextvars.ContextVar` set by the caller
does not reach (found on the H200: the backward's casts ignored the block). A thread's
own block wins there, so a thread serving under "torch" is not forced onto Triton by a
benchmark's "triton" block in another thread. Blocks entered by several threads may
exit in any order: one thread's exit never restores a mode another thread's open block
had replaced. (Where several threads hold different blocks while a CUDA backward runs,
its device thread sees the latest of them.)
"""

import contextlib
import importlib.util
import os
import threading

import torch

import lowp
from lowp_torch import _log, _storage

MODES = ("auto", "triton", "torch")
_MODE = ["auto"]  # the mode of the latest open block of any thread (module docstring)
_OPEN: list[tuple[object, str]] = []  # (block token, mode) of the open blocks, oldest first
_OPEN_LOCK = threading.Lock()
_THREAD = threading.local()  # .modes: the modes of this thread's open blocks, innermost last
_FP8 = ("float8_e4m3fn", "float8_e5m2")
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


@contextlib.contextmanager
def cast_kernels(mode: str):
    """Inside the block, `lowp_torch.quantize` runs on `mode`'s kernels.

    Args:
      mode: "auto" (the default: Triton where `triton_problem` finds nothing against
        it, else torch ops), "triton" (ValueError naming the reason where Triton cannot
        run) or "torch" (always the torch-ops algorithm, also on CUDA).

    The mode holds under torch.compile too, read when the graph is traced: a graph
    compiled under "torch" keeps Inductor's kernels of the torch ops.

    >>> import torch, lowp, lowp_torch
    >>> with lowp_torch.cast_kernels("torch"):
    ...     q = lowp_torch.quantize(torch.ones(4), lowp.TensorScaling())
    >>> q.codes.view(torch.uint8).tolist()
    [126, 126, 126, 126]
    """
    if mode not in MODES:
        raise ValueError(f"cast_kernels mode must be one of {MODES}, got {mode!r}")
    token = object()
    own = _own_modes()
    own.append(mode)
    with _OPEN_LOCK:
        _OPEN.append((token, mode))
        _MODE[0] = mode
    try:
        yield
    finally:
        own.pop()
        with _OPEN_LOCK:
            _OPEN[:] = [entry for entry in _OPEN if entry[0] is not token]
            _MODE[0] = _OPEN[-1][1] if _OPEN else "auto"


def current_mode() -> str:
    """The mode in this thread: its own innermost block's, else the latest open block's.
    Only reads: it is asked inside torch.compile'd autograd.Functions, where creating
    the thread's list would be a side effect Dynamo refuses."""
    own = getattr(_THREAD, "modes", None)
    return own[-1] if own else _MODE[0]


def _own_modes() -> list[str]:
    if not hasattr(_THREAD, "modes"):
        _THREAD.modes = []
    return _THREAD.modes


def use_triton(t, scheme, *, rounding, random_bits, seed, offset, check_finite, name) -> bool:
    """Whether `quantize` should run the Triton kernels for this call (module docstring).

    Logs the choice at debug level; ValueError under `cast_kernels("triton")` where
    they cannot run.
    """
    if type(t) not in _PLAIN_TENSORS and isinstance(t, torch.Tensor) and _storage.is_fake(t):
        # A FakeTensor object: torch.compile running a node on fake tensors, as for a
        # compiled model's QuantizedTensor weight dispatching F.linear. No launch and no
        # custom op there, whatever the mode. (Tensors Dynamo traces look like plain
        # tensors here, so `is_fake`, which it cannot trace, is never reached for them:
        # they take the custom ops.)
        return False
    mode = current_mode()
    if mode == "torch":
        _log.debug(lambda: f"{name}: quantize on torch ops (cast_kernels('torch'))")
        return False
    problem = triton_problem(
        t, scheme, rounding, random_bits, seed, offset, check_finite, mode == "triton"
    )
    if problem is None:
        _log.debug(lambda: f"{name}: quantize with {scheme} on the Triton kernels")
        return True
    if mode == "triton":
        raise ValueError(f"{name}: cast_kernels('triton') cannot run: {problem}")
    _log.debug(lambda: f"{name}: quantize on torch ops: {problem}")
    return False


def triton_problem(
    t, scheme, rounding, random_bits, seed, offset, check_finite, forced=False
) -> str | None:
    """Why the Triton kernels cannot quantize this call, or None when they can.
    `forced`: under cast_kernels("triton"), where the interpreter may run CPU tensors."""
    if (
        type(t) not in _PLAIN_TENSORS
        or t.dtype not in _storage.HP_DTYPES
        or (not _storage.traced(t) and t.layout != torch.strided)  # as _quantize asks
    ):
        return f"the input is not a dense float32/bfloat16/float16 tensor ({_describe(t)})"
    if t.device.type != "cuda" and not (forced and _interpreting()):
        return f"the input is on {t.device}, not CUDA"
    try:
        scheme.check_shape(tuple(t.shape))
    except ValueError as e:
        return f"the shape does not suit the scheme ({e})"
    if rounding != "nearest" or random_bits is not None or seed is not None or offset != 0:
        return "stochastic rounding runs on torch ops"
    if check_finite:
        return "check_finite=True runs on torch ops"
    if not _TRITON_INSTALLED:
        return "triton is not installed"
    return scheme_problem(scheme)


def scheme_problem(scheme) -> str | None:
    """Why the Triton kernels do not implement `scheme`, or None."""
    if not isinstance(
        scheme, (lowp.TensorScaling, lowp.AxisScaling, lowp.BlockScaling, lowp.MXScaling)
    ):
        return f"no Triton kernel for {type(scheme).__name__}"
    if scheme.fmt not in _FP8:
        return f"no Triton kernel for element format {scheme.fmt} (only {', '.join(_FP8)})"
    if isinstance(scheme, lowp.MXScaling) and scheme.block & (scheme.block - 1):
        return f"MX block {scheme.block} is not a power of two (Triton tiles are)"
    return None


def _describe(t) -> str:
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    layout = "" if t.layout == torch.strided else f", {t.layout}"
    return f"{type(t).__name__} of {t.dtype}{layout}"


_TRITON_INSTALLED = importlib.util.find_spec("triton") is not None  # found, not imported


def _interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (read as triton does)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


# Below this many bytes PyTorch's own copy is as fast: the tile kernel's launch is the cost.
_TRANSPOSE_MIN_BYTES = 1 << 20


def contiguous(t: torch.Tensor) -> torch.Tensor:
    """`t.contiguous()`, through `_triton_transpose` for a large transposed 2-D tensor of
    one-byte elements (fp8 codes) on CUDA in eager mode: PyTorch's strided copy of one
    takes about 1 ms at 16384 x 8192 on an H200, as long as an fp8 GEMM's operand read.
    The bytes are the same either way; `cast_kernels("torch")` keeps PyTorch's copy, and
    `cast_kernels("triton")` also runs the kernel on CPU tensors under the interpreter."""
    if t.is_contiguous() or t.dim() != 2 or t.element_size() != 1:
        return t.contiguous()
    mode = current_mode()
    runs = (t.is_cuda and t.numel() >= _TRANSPOSE_MIN_BYTES) or (
        mode == "triton" and _interpreting()
    )
    if (
        mode == "torch"
        or not runs
        or t.stride() != (1, t.shape[0])
        or t.shape[0] > 65535 * 64  # the kernel's grid axis 1 (rows are K or N: never)
        or _storage.traced(t)
        or not _TRITON_INSTALLED
    ):
        return t.contiguous()
    from lowp_torch import _triton_transpose  # imports triton: only when it runs

    return _triton_transpose.contiguous_transposed(t)
