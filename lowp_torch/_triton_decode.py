"""The decode linear: a quantized linear of few rows (M <= MAX_M) in one Triton launch.

    y = (E(x) @ w_codes.T) * x_scale[:, None] * w_scale[None, :] + bias

for a plain high-precision x (M, K), the float8_e4m3fn weight codes (N, K) and their
float32 scales (one, or one a row of w), and the activation quantized with the
preset's scheme (TensorScaling, or AxisScaling along K: `float8_tensorwise`'s and
`float8_rowwise`'s). At decode sizes the GEMM is memory-bound: the weight's bytes are
the cost, fp8 moves half of bf16's, and a launch of its own for the activation cast
costs more host time than the cast's device time. So each program

1. reads the whole (tiny) x and takes its amax: per row (AxisScaling) or over all of x
   (TensorScaling), as bits, and the scales from it (`_triton_kernels._float_scale`);
2. for its BLOCK_N weight rows and its share of K (split-K), encodes x's chunk to e4m3
   codes (`_triton_kernels._encode`: the bytes `lowp.quantize` writes) and multiplies
   their values by the weight's, reading each weight byte once;
3. combines its partial sums with the other K-shares of its tile (split-K), applies both
   scales and the bias to the float32 sum and rounds once to the output dtype.

Accumulation order (docs/numerics.md §7, "The decode kernel"): products of two e4m3
values are exact in float32, so only the sums round. The FMA form (one row; the default
there): each of the BLOCK_K lanes of a weight row sums its products over the split's K
chunks in K order, in float32; the lanes are then reduced in a tree of float32 adds. The
tensor-core form (`Config.use_dot`; the default for more rows): `tl.dot` of the codes'
float16 values (exact) into a float32 accumulator, chunk by chunk in K order. The split-K partials are added in split order by the tile's last program (a
counter per tile says which one is last; it resets the counter for the next launch),
then multiplied by the activation scale, then the weight scale, then the bias added.
Every step is fixed by the configuration, so results repeat run to run; they differ
from `torch._scaled_mm`'s (cuBLAS's own order) within §7's bound.

Which calls come here is `_linear._plan`'s business; this module imports triton.
"""

import dataclasses

import torch
import triton
import triton.language as tl
from triton import knobs

import lowp
from lowp import extend
from lowp_torch import _triton_casts

# By bare name, not through a module alias: Inductor rebuilds a `wrap_triton` kernel's
# source from the JIT functions its globals name, and skips attributes of modules.
from lowp_torch._triton_kernels import _abs_bits, _encode, _float_scale, _load

MAX_M = 16  # the rows a call may have; above it `torch._scaled_mm`'s tensor-core GEMM runs
MAX_SPLIT_K = 16
_AMAX_ELEMENTS = 8192  # x's elements the amax pass loads at once (tiles of the main loop)


@dataclasses.dataclass(frozen=True)
class Config:
    """A launch configuration. block_n: weight rows a program; block_k: K elements a
    step (contiguous weight bytes a row); split_k: programs sharing one tile's K;
    num_warps; use_dot: tl.dot on padded 16-row tiles (else broadcast FMAs, M == 1
    only); num_stages: Triton's software pipelining depth."""

    block_n: int
    block_k: int
    split_k: int
    num_warps: int = 4
    use_dot: bool = False
    num_stages: int = 3

    def __post_init__(self):
        for name in ("block_n", "block_k", "split_k", "num_warps"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"decode Config.{name} must be a power of two, got {v}")
        if self.split_k > MAX_SPLIT_K:
            raise ValueError(
                f"decode Config.split_k must be at most {MAX_SPLIT_K}, got {self.split_k}"
            )
        if self.use_dot and (self.block_n < 16 or self.block_k < 16):
            raise ValueError(
                f"decode Config with use_dot needs block_n, block_k >= 16, got {self.block_n}, {self.block_k}"
            )


def default_config(m: int, n: int, k: int, programs: int) -> Config:
    """The configuration of an (m, k) x (n, k) call on a device that wants about
    `programs` programs in flight (a few per SM): tiles of 16 weight rows (32 with
    tensor cores), 256 (128) bytes of K a step, and K split while the grid has at most
    half of them."""
    if m == 1:
        block_n, block_k, use_dot = 16, 256, False
    else:
        block_n, block_k, use_dot = 32, 128, True
    block_k = min(block_k, max(16, _pow2(k)))  # a short K in one step
    tiles = triton.cdiv(n, block_n)
    chunks = triton.cdiv(k, block_k)
    split = 1
    while split < MAX_SPLIT_K and tiles * split * 2 <= programs and split * 2 <= chunks:
        split *= 2
    return Config(block_n, block_k, split, use_dot=use_dot)


@triton.jit
def _decode_e4m3(codes):
    """float32 values of uint8 float8_e4m3fn codes (NaN for 0x7F / 0xFF), by their bits:
    the interpreter's path (the GPU's is the native conversion)."""
    c = codes.to(tl.int32)
    e = (c >> 3) & 0xF
    m = c & 0x7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)  # 2^(e-7) (1+m/8)
    v = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)  # subnormal: m * 2^-9
    v = tl.where((e == 15) & (m == 7), float("nan"), v)
    return tl.where((c >> 7) != 0, -v, v)


@triton.jit
def _values(codes, NATIVE: tl.constexpr, VALUE_DTYPE: tl.constexpr):
    """The values of uint8 e4m3 codes in VALUE_DTYPE (float16 or float32: exact)."""
    if NATIVE:
        return codes.to(tl.float8e4nv, bitcast=True).to(VALUE_DTYPE)
    return _decode_e4m3(codes).to(VALUE_DTYPE)


@triton.jit(do_not_specialize_on_alignment=["x_ptr", "y_ptr", "bias_ptr"])
def decode_linear_kernel(
    x_ptr,
    w_ptr,
    w_scale_ptr,
    bias_ptr,
    y_ptr,
    partial_ptr,
    count_ptr,
    codes_ptr,
    scale_ptr,
    N,
    K,
    M: tl.constexpr,
    A_ROWWISE: tl.constexpr,
    B_ROWWISE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    STORE_ACTIVATION: tl.constexpr,
    FMT_MAX: tl.constexpr,
    EBITS: tl.constexpr,
    MBITS: tl.constexpr,
    BIAS: tl.constexpr,
    POW2: tl.constexpr,
    NATIVE: tl.constexpr,
    VALUE_DTYPE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    K_STEPS: tl.constexpr,
    AMAX_UNROLL: tl.constexpr,
    AMAX_STEPS: tl.constexpr,
    EVEN_K: tl.constexpr,
    EVEN_N: tl.constexpr,
    USE_DOT: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """One (tile of BLOCK_N weight rows, K-share) a program (module docstring).

    x (M, K) and y (M, N) contiguous; w (N, K) uint8 codes; w_scale one float32, or N
    with B_ROWWISE; partial (SPLIT_K, M, N) float32 and count (N / BLOCK_N tiles) int32,
    zero at launch, with SPLIT_K > 1. STORE_ACTIVATION (tests): the first tile's
    programs also store x's codes (M, K) and the activation scales (M, or one)."""
    pid = tl.program_id(0)
    pid_n = pid // SPLIT_K
    pid_k = pid % SPLIT_K
    rows = tl.arange(0, BLOCK_M)
    row_mask = rows < M

    # 1. the activation's amax, per row or over all of x, and its scales. Read in the
    # main loop's (BLOCK_M, BLOCK_K) tiles, AMAX_UNROLL at once: the scales then have
    # the layout the codes need (other tiles made Triton 3.6's sm_90 lowering of the
    # tl.dot form fail an assertion in applyLinearLayout).
    kb = tl.arange(0, BLOCK_K)
    amax_tile = tl.zeros([BLOCK_M, BLOCK_K], tl.int32)
    for i in tl.range(AMAX_STEPS, num_stages=NUM_STAGES):
        for j in tl.static_range(AMAX_UNROLL):
            ks = (i * AMAX_UNROLL + j) * BLOCK_K + kb
            xa = _load(
                x_ptr, rows[:, None] * K + ks[None, :], row_mask[:, None] & (ks < K)[None, :]
            )
            amax_tile = tl.maximum(amax_tile, _abs_bits(xa))
    amax = tl.max(amax_tile, axis=1)
    if not A_ROWWISE:
        amax = tl.zeros([BLOCK_M], tl.int32) + tl.max(amax, axis=0)
    m, a_scale, poisoned = _float_scale(amax, FMT_MAX, POW2)

    # 2. this program's weight rows and K-share
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * K
    k_base = pid_k * (K_STEPS * BLOCK_K)
    if USE_DOT:
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    else:
        lanes = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    # tl.range's stages pipeline every load of the loop (the kernel's num_stages only
    # those feeding a tl.dot): the weight stream keeps NUM_STAGES chunks in flight.
    for i in tl.range(K_STEPS, num_stages=NUM_STAGES):
        ks = k_base + i * BLOCK_K + kb
        a_mask = row_mask[:, None] & (ks < K)[None, :]
        xk = _load(x_ptr, rows[:, None] * K + ks[None, :], a_mask)
        a_codes = _encode(xk, m[:, None], poisoned[:, None], FMT_MAX, EBITS, MBITS, BIAS, NATIVE)
        if STORE_ACTIVATION:
            tl.store(
                codes_ptr + rows[:, None] * K + ks[None, :], a_codes, mask=a_mask & (pid_n == 0)
            )
        if EVEN_K and EVEN_N:
            w_codes = tl.load(w_rows + ks[None, :], eviction_policy="evict_first")
        else:
            w_mask = col_mask[:, None] & (ks < K)[None, :]
            w_codes = tl.load(
                w_rows + ks[None, :], mask=w_mask, other=0, eviction_policy="evict_first"
            )
        if USE_DOT:
            a_values = _values(a_codes, NATIVE, VALUE_DTYPE)
            w_values = _values(w_codes, NATIVE, VALUE_DTYPE)
            acc = tl.dot(a_values, tl.trans(w_values), acc, out_dtype=tl.float32)
        else:  # M == 1: one product a lane, summed across lanes once at the end
            a_values = _values(a_codes, NATIVE, tl.float32)
            lanes += _values(w_codes, NATIVE, tl.float32) * a_values
    if not USE_DOT:
        acc = tl.sum(lanes, axis=1)[None, :]
    if STORE_ACTIVATION:
        if A_ROWWISE:
            tl.store(scale_ptr + rows, a_scale, mask=row_mask & (pid == 0))
        else:
            tl.store(scale_ptr + rows, a_scale, mask=(rows == 0) & (pid == 0))

    # 3. the K-shares' sum, the scales, the bias, one rounding
    out_mask = row_mask[:, None] & col_mask[None, :]
    out_offsets = rows[:, None] * N + cols[None, :]
    if SPLIT_K > 1:
        tl.store(partial_ptr + pid_k * M * N + out_offsets, acc, mask=out_mask)
        tl.debug_barrier()  # every thread's partial stored before the count moves
        done = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel")
        if done == SPLIT_K - 1:  # the tile's last program: add the partials in split order
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for s in range(SPLIT_K):
                acc += tl.load(
                    partial_ptr + s * M * N + out_offsets,
                    mask=out_mask,
                    other=0.0,
                    cache_modifier=".cg",
                )
            tl.atomic_xchg(count_ptr + pid_n, 0)  # zero for the next launch
            _epilogue(
                acc,
                a_scale,
                w_scale_ptr,
                bias_ptr,
                y_ptr,
                cols,
                col_mask,
                out_offsets,
                out_mask,
                B_ROWWISE,
                HAS_BIAS,
            )
    else:
        _epilogue(
            acc,
            a_scale,
            w_scale_ptr,
            bias_ptr,
            y_ptr,
            cols,
            col_mask,
            out_offsets,
            out_mask,
            B_ROWWISE,
            HAS_BIAS,
        )


@triton.jit
def _epilogue(
    acc,
    a_scale,
    w_scale_ptr,
    bias_ptr,
    y_ptr,
    cols,
    col_mask,
    out_offsets,
    out_mask,
    B_ROWWISE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """y = acc * a_scale * w_scale (+ bias), rounded once to y's dtype."""
    if B_ROWWISE:
        w_scale = tl.load(w_scale_ptr + cols, mask=col_mask, other=1.0)
    else:
        w_scale = tl.load(w_scale_ptr + cols * 0)
    y = acc * a_scale[:, None] * w_scale[None, :]
    if HAS_BIAS:
        y += tl.load(bias_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + out_offsets, y.to(y_ptr.dtype.element_ty), mask=out_mask)


# --- launches --------------------------------------------------------------------------

# The kernel's arguments before the workspace; a bound launch passes them per call.
_CALL_ARGS = ("x_ptr", "w_ptr", "w_scale_ptr", "bias_ptr", "y_ptr")
_workspaces: dict = {}  # (device, stream) -> [partials, counts]; old ones kept (graphs)


def _workspace(device, stream, partials: int, tiles: int):
    """float32 partial sums and zeroed int32 tile counts for a split-K launch on
    `stream`: one pair a stream (launches on one stream run in order, and every launch
    leaves its counts zero), grown as needed. A replaced pair stays referenced, since a
    captured CUDA graph may still point at it."""
    kept = _workspaces.setdefault((device, stream), [])
    if not kept or kept[-1][0].numel() < partials or kept[-1][1].numel() < tiles:
        size = max(partials, kept[-1][0].numel() if kept else 0)
        count = max(tiles, kept[-1][1].numel() if kept else 0)
        kept.append(
            (
                torch.empty(size, dtype=torch.float32, device=device),
                torch.zeros(count, dtype=torch.int32, device=device),
            )
        )
    return kept[-1]


def _sm_count(device) -> int:
    if device.type != "cuda":
        return 8
    return torch.cuda.get_device_properties(device).multi_processor_count


class Decode:
    """The decode launches of one weight shape: `__call__(x, w_codes, w_scale, bias)`.

    n, k: the weight's (N, K); hp_dtype: x's and y's dtype; device: theirs (x must be
    on it); scheme: the activation's
    (TensorScaling, or AxisScaling along the last axis, e4m3); w_rowwise: whether the
    weight has a scale a row. The first call of each M (and bias or not, and stream)
    compiles and binds the kernel; later calls on the GPU launch the bound kernel
    directly (`_BoundLaunch`): no argument binding or specialisation in Python.
    """

    def __init__(self, n, k, hp_dtype, device, scheme, w_rowwise: bool):
        if extend.element_format(scheme.fmt).name != "float8_e4m3fn":
            raise ValueError(f"the decode kernel takes float8_e4m3fn activations, got {scheme.fmt}")
        self.n, self.k, self.hp_dtype, self.device = n, k, hp_dtype, device
        self.scheme, self.w_rowwise = scheme, w_rowwise
        self.a_rowwise = isinstance(scheme, lowp.AxisScaling)
        self.programs = 4 * _sm_count(device)
        self.cuda_index = device.index if device.type == "cuda" else None
        fmt = extend.element_format(scheme.fmt)
        self.element_args = {
            "FMT_MAX": fmt.max,
            "EBITS": fmt.ebits,
            "MBITS": fmt.mbits,
            "BIAS": fmt.bias,
        }
        self._bound: dict = {}

    def __call__(self, x, w_codes, w_scale, bias=None, out_shape=None, config=None):
        """y (out_shape or (M, N), x's dtype) of x (M, K) contiguous, 1 <= M <= MAX_M;
        w_codes (N, K) uint8, w_scale float32 flat (1 or N); bias (N,) of x's dtype."""
        m = x.shape[0]
        y = torch.empty(out_shape or (m, self.n), dtype=self.hp_dtype, device=self.device)
        stream = None
        if self.cuda_index is not None and not launch_hooks_set():
            # (with launch hooks set, e.g. a Triton profiler's, Triton's own launch runs)
            stream = torch._C._cuda_getCurrentRawStream(self.cuda_index)
            bound = self._bound.get((m, bias is not None, stream, config))
            if bound is not None and torch._C._cuda_getDevice() == self.cuda_index:
                bound(x, w_codes, w_scale, w_scale if bias is None else bias, y)
                return y
        with _triton_casts._on_device(x):
            self._launch(x, w_codes, w_scale, bias, y, config, None, stream)
        return y

    def constexprs(self, m, config, has_bias, store, native) -> dict:
        """The kernel's constexpr arguments for M rows and `config`; native: the GPU's
        fp8 conversions (`_triton_casts._native`)."""
        block_m = max(16, _pow2(m)) if config.use_dot else _pow2(m)
        chunks = triton.cdiv(self.k, config.block_k)
        # x's tiles the amax pass loads at once: about _AMAX_ELEMENTS, at most all of x
        amax_unroll = min(chunks, max(1, _AMAX_ELEMENTS // (block_m * config.block_k)))
        return {
            "M": m,
            "A_ROWWISE": self.a_rowwise,
            "B_ROWWISE": self.w_rowwise,
            "HAS_BIAS": has_bias,
            "STORE_ACTIVATION": store,
            "POW2": self.scheme.pow2,
            "VALUE_DTYPE": tl.float16 if native else tl.float32,
            "BLOCK_M": block_m,
            "BLOCK_N": config.block_n,
            "BLOCK_K": config.block_k,
            "SPLIT_K": config.split_k,
            "K_STEPS": triton.cdiv(chunks, config.split_k),
            "AMAX_UNROLL": amax_unroll,
            "AMAX_STEPS": triton.cdiv(chunks, amax_unroll),
            "EVEN_K": self.k % config.block_k == 0 and chunks % config.split_k == 0,
            "EVEN_N": self.n % config.block_n == 0,
            "USE_DOT": config.use_dot,
            "NUM_STAGES": config.num_stages,
            **self.element_args,
            "NATIVE": native,
        }

    def traced_call(self, x, w_codes, w_scale, bias):
        """`__call__` as a compiled graph makes it (`_decode_op`'s triton_op): the launch
        through `wrap_triton`, so Inductor launches the kernel from its own code, not
        through a Python op; the split-K workspace is the graph's, its counts zeroed
        each call (the eager workspace's reuse across calls is not traceable)."""
        from torch.library import wrap_triton

        m = x.shape[0]
        config = default_config(m, self.n, self.k, self.programs)
        y = torch.empty((m, self.n), dtype=self.hp_dtype, device=x.device)
        partials, counts = w_scale, w_scale
        tiles = triton.cdiv(self.n, config.block_n)
        if config.split_k > 1:
            partials = torch.empty(
                config.split_k * m * self.n, dtype=torch.float32, device=x.device
            )
            counts = torch.zeros(tiles, dtype=torch.int32, device=x.device)
        args = self._args(x, w_codes, w_scale, bias, y, config, None, partials, counts)
        wrap_triton(decode_linear_kernel)[(tiles * config.split_k,)](
            **args, num_warps=config.num_warps, num_stages=config.num_stages
        )
        return y

    def _launch(self, x, w_codes, w_scale, bias, y, config, store, stream):
        """The general launch; with a stream (CUDA), also binds it for `__call__`'s
        later calls of this M, bias or not, stream and config (None: the default).
        store: (codes (M, K) uint8, scales) buffers the kernel fills (tests)."""
        m = x.shape[0]
        key = (m, bias is not None, stream, config)
        config = config or default_config(m, self.n, self.k, self.programs)
        tiles = triton.cdiv(self.n, config.block_n)
        partials, counts = w_scale, w_scale  # pointers this launch does not read
        if config.split_k > 1:
            partials, counts = _workspace(x.device, stream, config.split_k * m * self.n, tiles)
        args = self._args(x, w_codes, w_scale, bias, y, config, store, partials, counts)
        if m != 1 and not config.use_dot:
            raise ValueError(f"the decode kernel's FMA form takes one row, got M={m}")
        grid = (tiles * config.split_k,)
        compiled = decode_linear_kernel[grid](
            **args, num_warps=config.num_warps, num_stages=config.num_stages
        )
        if stream is not None and store is None and compiled is not None:
            if hasattr(compiled, "result"):
                compiled = compiled.result()
            values = [args[name] for name in decode_linear_kernel.arg_names]
            self._bound[key] = _BoundLaunch(compiled, grid, stream, values)

    def _args(self, x, w_codes, w_scale, bias, y, config, store, partials, counts) -> dict:
        """The kernel's arguments, by name; w_scale stands in for pointers not read."""
        unused = w_scale
        m = x.shape[0]
        return {
            "x_ptr": x,
            "w_ptr": w_codes,
            "w_scale_ptr": w_scale,
            "bias_ptr": unused if bias is None else bias,
            "y_ptr": y,
            "partial_ptr": partials,
            "count_ptr": counts,
            "codes_ptr": unused if store is None else store[0],
            "scale_ptr": unused if store is None else store[1],
            "N": self.n,
            "K": self.k,
            **self.constexprs(
                m, config, bias is not None, store is not None, _triton_casts._native(x)
            ),
        }


def launch_hooks_set() -> bool:
    """Whether a Triton launch hook is installed (a Triton profiler's, say): then every
    launch goes through Triton's own `run`, which calls it. Triton 3.6 keeps the hooks in
    a `HookChain`, an object even when it holds none; older versions keep None."""
    hook = knobs.runtime.launch_enter_hook
    return hook is not None and bool(getattr(hook, "calls", True))


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


class _BoundLaunch:
    """A compiled kernel and its constant arguments: a call passes x, w, w_scale, bias
    and y and launches, as `JITFunction.run` does once it has found the kernel."""

    __slots__ = ("function", "grid", "launcher", "metadata", "stream", "tail")

    def __init__(self, compiled, grid, stream, values):
        if tuple(decode_linear_kernel.arg_names[: len(_CALL_ARGS)]) != _CALL_ARGS:
            raise AssertionError("decode_linear_kernel's leading arguments moved")
        self.launcher = compiled.run  # loads the module: the launcher and the function
        self.function, self.metadata = compiled.function, compiled.packed_metadata
        self.grid, self.stream = grid[0], stream
        # The workspace and the unread pointers as addresses: the launcher takes an int
        # as it is, where a tensor costs a `data_ptr()` call and a driver query. The
        # workspace stays referenced in `_workspaces`; the others are never read.
        self.tail = tuple(
            v.data_ptr() if isinstance(v, torch.Tensor) else v for v in values[len(_CALL_ARGS) :]
        )

    def __call__(self, x, w, w_scale, bias, y):
        self.launcher(
            self.grid,
            1,
            1,
            self.stream,
            self.function,
            self.metadata,
            None,
            None,
            None,
            x,
            w,
            w_scale,
            bias,
            y,
            *self.tail,
        )


def activation_codes(decode: Decode, x, w_codes, w_scale, bias=None, config=None):
    """(y, codes (M, K) uint8, scales (M,) or (1,) float32): a call that also stores the
    activation's codes and scales as the kernel computed them (tests)."""
    m = x.shape[0]
    y = torch.empty((m, decode.n), dtype=decode.hp_dtype, device=x.device)
    codes = torch.zeros((m, decode.k), dtype=torch.uint8, device=x.device)
    scales = torch.zeros(m if decode.a_rowwise else 1, dtype=torch.float32, device=x.device)
    with _triton_casts._on_device(x):
        decode._launch(x, w_codes, w_scale, bias, y, config, (codes, scales), None)
    return y, codes, scales
