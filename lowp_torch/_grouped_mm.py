"""`grouped_mm`: the grouped GEMM of a mixture of experts with a lowp recipe (spec §10).

For x (T, K), the tokens sorted by expert, w (E, N, K) the stacked expert weights and
offs (E,) int32 the cumulative end offsets (`torch._grouped_mm`'s), `grouped_mm(x, w,
offs, recipe)` computes y[e] = x[e] @ w[e].T for each expert's run of rows, and its
backward the dgrad dx[e] = g[e] @ w[e] and the wgrad dw[e] = g[e].T @ x[e], each a
grouped GEMM whose operands the core's `GroupedPlan` gives: quantized along the GEMM's
reduction axis, with no scale covering two experts.

Operands are quantized with `lowp_torch.quantize`. Where a group's extent depends on
the routing (an expert's tokens, the wgrad's scales, and tensorwise scaling per
expert), each element is paired with its group's amax, a segment max, and the pair
quantized with `extend.pair_scheme` (spec §10): no loop over experts, no host sync.

GEMMs: on CUDA compute capability 9.0+, float8 rowwise operands (all three GEMMs)
go to `torch._scaled_grouped_mm` where its shapes allow (feature dims and every
expert's tokens multiples of 16); everything else is emulated: the dequantized
operands multiplied in float32 by `torch._grouped_mm` and rounded once.
"""

import torch
import torch.nn.functional as F

import lowp
from lowp import extend
from lowp_torch import _cast_kernels, _cast_ops, _gemm, _log, _qtensor, _quantize, _storage

KERNELS = ("auto", "scaled_grouped_mm", "emulated")


# --- group boundaries and segments ---


def group_sizes(offs: torch.Tensor, tokens: int) -> torch.Tensor:
    """int64 sizes (E,) from int32 end offsets; in eager mode, ValueError naming offs
    unless they are non-decreasing and end at `tokens` (`extend.group_sizes_from_offs`)."""
    return _routing(offs, tokens)[0]


def _routing(offs: torch.Tensor, tokens: int) -> tuple[torch.Tensor, bool | None]:
    """(int64 sizes (E,) on offs' device, whether every expert's tokens are a multiple
    of 16), with the checks of `group_sizes`. The one host read of a call: eager mode
    copies offs to the host once for both; under torch.compile there is none, and the
    alignment is None (unknown)."""
    if not isinstance(offs, torch.Tensor) or offs.dim() != 1 or offs.dtype != torch.int32:
        raise ValueError(f"offs must be a 1-D int32 tensor of end offsets, got {offs!r:.80}")
    sizes = torch.diff(offs.to(torch.int64), prepend=offs.new_zeros(1, dtype=torch.int64))
    if _storage.traced(offs):
        return sizes, None
    host = extend.group_sizes_from_offs(offs.cpu().numpy(), tokens)
    return sizes, not bool((host % 16).any())


def _segments(sizes: torch.Tensor, tokens: int, block: int | None) -> torch.Tensor:
    """Each token's expert, or its MX block's slot (`extend.token_segments`)."""
    experts = torch.arange(sizes.shape[0], device=sizes.device)
    expert = torch.repeat_interleave(experts, sizes, output_size=tokens)
    if block is None:
        return expert
    starts = torch.cumsum(sizes, 0) - sizes
    blocks = (sizes + (block - 1)) // block
    first_slot = torch.cumsum(blocks, 0) - blocks
    within = torch.arange(tokens, device=sizes.device) - starts[expert]
    return first_slot[expert] + within // block


def _segment_quantize(t, seg, segments: int, scheme, whole_rows: bool, name: str):
    """(codes shaped like t, scales (segments, C) or (segments, 1) for whole rows) of
    t (T, C) with one group per segment of rows (and column, unless whole_rows): each
    element paired with its group's amax and quantized with `extend.pair_scheme`."""
    xf = t.detach().to(torch.float32)
    absb = xf.view(torch.int32) & 0x7FFFFFFF
    if whole_rows:
        absb = torch.amax(absb, dim=1, keepdim=True) if xf.shape[1] else absb[:, :1] * 0
    amax = torch.zeros(segments, absb.shape[1], dtype=torch.int32, device=t.device)
    amax = amax.scatter_reduce(0, seg[:, None].expand(absb.shape), absb, "amax")
    a = amax.view(torch.float32)
    pair = extend.pair_scheme(scheme)
    # A is the magnitude of one of t's elements: exact in t's dtype, so the pairs are
    # half the bytes of float32 ones.
    hp = t.detach()
    pairs = torch.stack([hp, a[seg].to(hp.dtype).expand(hp.shape)], -1)
    codes = _quantize.quantize(pairs, pair, name=name).codes[..., 0]
    scale = _quantize.quantize(torch.stack([a, a], -1), pair, name=name).scale[..., 0]
    return codes, scale


def quantize_operand(t: torch.Tensor, op, sizes: torch.Tensor, name: str = "input", offs=None):
    """(codes, scale) of a grouped operand, as the GEMM reads it: the bytes of
    `extend.quantize_grouped(t, op.scheme, sizes, op.kind)` (spec §10).

    t: (T, C) token-major for "rows" and "tokens" (whose operand is t.T), (E, R, C) for
    "experts", which may be the transposed view of a contiguous (E, C, R) (the dgrad's
    w.T). Codes come back in the operand's shape (a transposed view for tokens on
    torch ops, contiguous from the Triton kernels). offs: the int32 end offsets
    `sizes` came from, if the caller has them (the Triton kernels read them).

    Rows and experts go through `lowp_torch.quantize` (the dense fused Triton casts on
    CUDA: a row's scale does not depend on the groups; w.T's from w itself, the codes
    written (E, K, N) contiguous, `_triton_casts.transposed_source`); tokens through
    `_triton_grouped` where `_tokens_problem` finds nothing against it, else the
    segment-max pairs below.
    """
    scheme, kind = op.scheme, op.kind
    tensorwise = isinstance(scheme, lowp.TensorScaling)
    if kind == "experts":
        if tensorwise:  # one scale per expert: a row of the flattened experts
            rows = t.reshape(t.shape[0], -1)
            q = _quantize.quantize(rows, lowp.AxisScaling(scheme.fmt, -1, scheme.pow2), name=name)
            return q.codes.reshape(t.shape), q.scale.reshape(-1)
        q = _quantize.quantize(t, scheme, name=name)
        return q.codes, q.scale
    tokens, experts = t.shape[0], sizes.shape[0]
    if kind == "rows" and not tensorwise:
        q = _quantize.quantize(t, scheme, name=name)
        return q.codes, q.scale
    if kind == "tokens" and _tokens_problem(t, scheme, name) is None:
        return _tokens_on_triton(t, scheme, offs if offs is not None else _offs(sizes))
    block = scheme.block if scheme.family == "mx" else None
    seg = _segments(sizes, tokens, block)
    segments = experts if block is None else extend.token_capacity(tokens, experts, block)
    codes, scale = _segment_quantize(t, seg, segments, scheme, tensorwise, name)
    if tensorwise:
        return (codes if kind == "rows" else codes.t()), scale.reshape(-1)
    return codes.t(), scale.t()


def dequantize_operand(codes, scale, op, sizes: torch.Tensor) -> torch.Tensor:
    """The float32 values of a grouped operand (the GEMM emulation's input)."""
    values = codes.to(torch.float32)
    s = scale.to(torch.float32)
    tensorwise = isinstance(op.scheme, lowp.TensorScaling)
    if op.kind == "experts":
        if tensorwise:
            return values * s[:, None, None]
        if op.scheme.family == "mx":
            s = torch.repeat_interleave(s, op.scheme.block, dim=-1)
        return values * s
    tokens = codes.shape[0] if op.kind == "rows" else codes.shape[1]
    expert = _segments(sizes, tokens, None)
    if op.kind == "rows":
        if tensorwise:
            return values * s[expert][:, None]
        if op.scheme.family == "mx":
            s = torch.repeat_interleave(s, op.scheme.block, dim=-1)
        return values * s
    if tensorwise:
        return values * s[expert][None, :]
    if op.scheme.family == "mx":
        return values * s[:, _segments(sizes, tokens, op.scheme.block)]
    return values * s[:, expert]


def _offs(sizes: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(sizes, 0).to(torch.int32)


def _tokens_problem(t: torch.Tensor, scheme, name: str) -> str | None:
    """Why `_triton_grouped` cannot quantize operand t along its tokens, or None; under
    cast_kernels("triton") a reason is a ValueError (as for the dense casts)."""
    mode = _cast_kernels.current_mode()
    if mode == "torch":
        return "cast_kernels('torch')"
    problem = _cast_kernels.scheme_problem(scheme)
    if isinstance(scheme, lowp.TensorScaling):
        problem = "tensorwise scales per expert run on torch ops"
    elif t.dtype not in _storage.HP_DTYPES:
        problem = f"the input is {t.dtype}, not float32/bfloat16/float16"
    elif not _cast_kernels._TRITON_INSTALLED:
        problem = "triton is not installed"
    elif not t.is_cuda and not (mode == "triton" and _cast_kernels._interpreting()):
        problem = f"the input is on {t.device}, not CUDA"
    if problem is not None and mode == "triton":
        raise ValueError(f"{name}: cast_kernels('triton') cannot run: {problem}")
    return problem


def _tokens_on_triton(t: torch.Tensor, scheme, offs: torch.Tensor):
    """(codes (C, T), scales (C, E) float or (C, capacity) e8m0) of t along each
    expert's tokens, by `_triton_grouped` (through a custom op under torch.compile)."""
    x = t.detach().contiguous()
    if _storage.traced(x):
        codes, scale = torch.ops.lowp.triton_grouped_tokens(x, offs, _cast_ops.scheme_key(scheme))
    else:
        from lowp_torch import _triton_grouped  # imports triton: only when it runs

        codes, scale = _triton_grouped.launch_tokens(x, offs, scheme)
    codes = _storage.as_stored(codes, _storage.CODE_DTYPES[scheme.fmt])
    if isinstance(scheme, lowp.MXScaling):
        return codes, _storage.as_stored(scale, torch.float8_e8m0fnu)
    return codes, scale.t()


def _dy_operands(dy: torch.Tensor, plan, sizes, offs, name: str) -> dict:
    """{"dgrad": (codes, scale), "wgrad": (codes, scale)}: dy quantized as the dgrad's
    rows and the wgrad's tokens (`quantize_operand` of each), from one pass of
    `_triton_grouped.launch_rows_and_tokens` where both GEMMs take dy with the same
    AxisScaling on the Triton casts in eager mode (float8_rowwise's), else apart."""
    scheme = plan.dgrad.a.scheme
    fused = (
        plan.wgrad.a.scheme == scheme
        and isinstance(scheme, lowp.AxisScaling)
        and dy.shape[0] > 0
        and dy.shape[1] > 0
        and not _storage.traced(dy)
        and _tokens_problem(dy, scheme, f"{name} dgrad and wgrad: dy") is None
    )
    if not fused:
        return {
            "dgrad": quantize_operand(dy, plan.dgrad.a, sizes, f"{name} dgrad: dy", offs),
            "wgrad": quantize_operand(dy, plan.wgrad.a, sizes, f"{name} wgrad: dy.T", offs),
        }
    from lowp_torch import _triton_grouped  # imports triton: only when it runs

    code_dtype = _storage.CODE_DTYPES[scheme.fmt]
    rows, tokens = _triton_grouped.launch_rows_and_tokens(dy.detach(), offs, scheme)
    return {
        "dgrad": (_storage.as_stored(rows[0], code_dtype), rows[1].reshape(-1, 1)),
        "wgrad": (_storage.as_stored(tokens[0], code_dtype), tokens[1].t()),
    }


@torch.library.custom_op("lowp::triton_grouped_tokens", mutates_args=())
def _tokens_op(
    x: torch.Tensor, offs: torch.Tensor, scheme: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """`_triton_grouped.launch_tokens` as an op a compiled graph calls."""
    from lowp_torch import _triton_grouped  # imports triton

    return _triton_grouped.launch_tokens(x.contiguous(), offs, _cast_ops.scheme_of_key(scheme))


@_tokens_op.register_fake
def _(x, offs, scheme):
    s = _cast_ops.scheme_of_key(scheme)
    tokens, cols = x.shape
    codes = x.new_empty((cols, tokens), dtype=torch.uint8)
    if isinstance(s, lowp.MXScaling):
        capacity = extend.token_capacity(tokens, offs.shape[0], s.block)
        return codes, x.new_empty((cols, capacity), dtype=torch.uint8)
    return codes, x.new_empty((offs.shape[0], cols), dtype=torch.float32)


# --- the GEMMs ---


def _pad_last(t: torch.Tensor, multiple: int = 4) -> torch.Tensor:
    """Zero-pad the last dim to a multiple of 4 float32s: `torch._grouped_mm` wants
    16-byte strides. Exact (zeros add nothing; padded output columns are dropped)."""
    pad = -t.shape[-1] % multiple
    return F.pad(t, (0, pad)) if pad else t


def _grouped_f32(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """float32 grouped GEMM of token-major a (T, R) by per-expert b (E, C, R):
    out[t] = a[t] @ b[e(t)].T, (T, C)."""
    if _storage.traced(a):  # a compiled graph: no float32 _grouped_mm in it (_masked_f32)
        return _masked_f32(a, b, offs)
    c = b.shape[1]
    bt = _pad_last(_pad_last(b).transpose(-2, -1))  # (E, R, C), both padded
    return torch._grouped_mm(_pad_last(a), bt, offs=offs)[:, :c]


def _grouped_wgrad_f32(g: torch.Tensor, x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """float32 dw[e] = g[e].T @ x[e] for token-major g (T, N), x (T, K): (E, N, K)."""
    if _storage.traced(g):
        return _masked_wgrad_f32(g, x, offs)
    n, k = g.shape[1], x.shape[1]
    return torch._grouped_mm(_pad_last(g).t(), _pad_last(x), offs=offs)[:, :n, :k]


def _masks(offs: torch.Tensor, tokens: int, device) -> list[torch.Tensor]:
    """(T, 1) bool per expert: its run of tokens."""
    t = torch.arange(tokens, device=device)[:, None]
    starts = torch.cat([offs.new_zeros(1), offs[:-1]])
    return [(t >= starts[e]) & (t < offs[e]) for e in range(offs.shape[0])]


def _masked_f32(a, b, offs):
    """`_grouped_f32` as E dense GEMMs whose other experts' rows are selected away (not
    multiplied by 0: a NaN there must not leak), for torch.compile.

    Compiled graphs never get the float32 `torch._grouped_mm` of the eager path: its
    meta kernel took bf16 only on older torch, and on torch 2.11 Inductor's fallback
    for it (CPU, padded and transposed float32 operands) gave a wrong dgrad wholesale
    (tests/torch_frontend/test_grouped_mm.py::test_compiled_equals_eager). The
    backward is traced by AOTAutograd, where `torch.compiler.is_compiling()` is False,
    so the test is `_storage.traced` (fake tensors), not Dynamo's flag alone."""
    out = a.new_zeros(a.shape[0], b.shape[1])
    for e, mask in enumerate(_masks(offs, a.shape[0], a.device)):
        out = torch.where(mask, a @ b[e].t(), out)
    return out


def _masked_wgrad_f32(g, x, offs):
    masks = _masks(offs, g.shape[0], g.device)
    return torch.stack([torch.where(m, g, 0).t() @ torch.where(m, x, 0) for m in masks])


def _scaled_grouped_problem(gemm, kernel: str, device, dims, aligned, out_dtype) -> str | None:
    """None if `torch._scaled_grouped_mm` runs this GEMM, else why not. aligned: whether
    every expert's tokens are a multiple of 16 (None under torch.compile: unknown)."""
    if kernel == "emulated":
        return "kernel='emulated'"
    problem = _gemm_kernel_problem(gemm, device)
    if problem is not None:
        return problem
    if any(d % 16 for d in dims):
        return f"feature dims {dims} are not multiples of 16"
    if out_dtype != torch.bfloat16:
        return f"its output is {out_dtype}; the fp8 grouped GEMM writes bfloat16"
    if aligned is False:  # None under torch.compile: no host read there
        return "an expert's token count is not a multiple of 16"
    return None


def _gemm_kernel_problem(gemm, device) -> str | None:
    """Why `torch._scaled_grouped_mm` cannot run `gemm` on `device` whatever the shapes."""
    if device.type != "cuda":
        return f"{device.type} has no fp8 grouped GEMM"
    if not hasattr(torch, "_scaled_grouped_mm"):
        return "this torch has no torch._scaled_grouped_mm"
    major, minor = _gemm._cuda_capability(device.index)
    if (major, minor) < (9, 0):
        return f"compute capability {major}.{minor} < 9.0"
    for op in (gemm.a, gemm.b):
        if op.scheme != lowp.AxisScaling("float8_e4m3fn", -1, op.scheme.pow2):
            return f"{op.tensor} is {op.scheme}, not float8_e4m3fn rowwise"
    return None


def kernel_problem(recipe, device) -> str | None:
    """Why some grouped GEMM of `recipe` is emulated on `device` (dequantized operands in
    float32) rather than run on an fp8 grouped kernel, shapes aside; None when all three
    run on `torch._scaled_grouped_mm`. For benchmarks choosing what is worth timing."""
    plan = extend.GroupedPlan.of(lowp.Recipe.of(recipe))
    device = torch.device(device)
    for name in ("forward", "dgrad", "wgrad"):
        gemm = getattr(plan, name)
        if gemm is None:
            return f"its {name} GEMM is in high precision (float32, emulated)"
        problem = _gemm_kernel_problem(gemm, device)
        if problem is not None:
            return f"its {name} GEMM: {problem}"
    return None


def _product(gemm, a, b, sizes, offs, aligned, out_dtype, kernel: str, name: str):
    """One quantized grouped GEMM of the plan, on torch._scaled_grouped_mm or emulated."""
    (ac, as_), (bc, bs) = a, b
    dims = (ac.shape[-1], bc.shape[-2]) if gemm.name != "wgrad" else (ac.shape[0], bc.shape[0])
    problem = _scaled_grouped_problem(gemm, kernel, ac.device, dims, aligned, out_dtype)
    if problem is None:
        return _scaled_grouped(gemm, a, b, offs, out_dtype)
    if kernel == "scaled_grouped_mm":
        raise ValueError(f"{name}: kernel='scaled_grouped_mm' cannot run it: {problem}")
    _log.info_once((name, gemm.name, problem), f"{name} {gemm.name}: emulated ({problem})")
    av = dequantize_operand(ac, as_, gemm.a, sizes)
    bv = dequantize_operand(bc, bs, gemm.b, sizes)
    if gemm.name == "wgrad":
        # token-major for _grouped_mm (the Triton casts write the codes (C, T))
        return _grouped_wgrad_f32(av.t().contiguous(), bv.t().contiguous(), offs).to(out_dtype)
    return _grouped_f32(av, bv, offs).to(out_dtype)


def _scaled_grouped(gemm, a, b, offs, out_dtype) -> torch.Tensor:
    """torch._scaled_grouped_mm on rowwise e4m3 operands: a row-major, b column-major,
    decode scales as the kernel's (torchao's `_Float8GroupedMM` layout)."""
    (ac, as_), (bc, bs) = a, b
    fast = gemm.fast_accum
    if gemm.name == "wgrad":  # 2-D by 2-D: a (N, T), b (T, K); scales (E*N,), (E*K,)
        return torch._scaled_grouped_mm(
            ac.contiguous(),
            bc.contiguous().t(),
            as_.t().contiguous().reshape(-1),
            bs.t().contiguous().reshape(-1),
            offs=offs,
            out_dtype=out_dtype,
            use_fast_accum=fast,
        )
    # a (T, R) rows with scales (T, 1); b (E, C, R) experts with scales (E, C, 1)
    return torch._scaled_grouped_mm(
        ac.contiguous(),
        bc.contiguous().transpose(-2, -1),
        as_.reshape(-1),
        bs.reshape(bs.shape[0], -1),
        offs=offs,
        out_dtype=out_dtype,
        use_fast_accum=fast,
    )


class _GroupedMMFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, offs, plan, kernel, name):
        sizes, aligned = _routing(offs, x.shape[0])
        fwd = plan.forward
        a = quantize_operand(x, fwd.a, sizes, f"{name} forward: x", offs)
        b = quantize_operand(w, fwd.b, sizes, f"{name} forward: w", offs)
        y = _product(fwd, a, b, sizes, offs, aligned, x.dtype, kernel, name)
        ctx.save_for_backward(x, w, offs, sizes)
        ctx.plan, ctx.kernel, ctx.name, ctx.aligned = plan, kernel, name, aligned
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, offs, sizes = ctx.saved_tensors
        plan, kernel, name, aligned = ctx.plan, ctx.kernel, ctx.name, ctx.aligned
        dy = dy.contiguous()
        dx = dw = None
        both = ctx.needs_input_grad[0] and ctx.needs_input_grad[1]
        dy_ops = (
            _dy_operands(dy, plan, sizes, offs, name)
            if both and plan.dgrad is not None and plan.wgrad is not None
            else {}
        )
        if ctx.needs_input_grad[0]:
            if plan.dgrad is None:
                dx = _grouped_f32(dy.float(), w.float().transpose(-2, -1), offs).to(x.dtype)
            else:
                a = dy_ops.get("dgrad") or quantize_operand(
                    dy, plan.dgrad.a, sizes, f"{name} dgrad: dy", offs
                )
                # a view: the casts read w itself (`_triton_casts.transposed_source`)
                wt = w.transpose(-2, -1)
                b = quantize_operand(wt, plan.dgrad.b, sizes, f"{name} dgrad: w.T", offs)
                dx = _product(plan.dgrad, a, b, sizes, offs, aligned, x.dtype, kernel, name)
        if ctx.needs_input_grad[1]:
            if plan.wgrad is None:
                dw = _grouped_wgrad_f32(dy.float(), x.float(), offs).to(w.dtype)
            else:
                a = dy_ops.get("wgrad") or quantize_operand(
                    dy, plan.wgrad.a, sizes, f"{name} wgrad: dy.T", offs
                )
                b = quantize_operand(x, plan.wgrad.b, sizes, f"{name} wgrad: x.T", offs)
                dw = _product(plan.wgrad, a, b, sizes, offs, aligned, w.dtype, kernel, name)
        return dx, dw, None, None, None, None


def _check(x, w, offs, name: str) -> None:
    if x.dim() != 2 or w.dim() != 3 or x.shape[1] != w.shape[2]:
        raise ValueError(
            f"{name}: grouped_mm takes x (T, K) and w (E, N, K), "
            f"got x {tuple(x.shape)}, w {tuple(w.shape)}"
        )
    if offs.shape != (w.shape[0],):
        raise ValueError(f"{name}: offs must be ({w.shape[0]},), one per expert, got {offs!r:.80}")


def grouped_mm(
    x: torch.Tensor,
    w: torch.Tensor,
    offs: torch.Tensor,
    recipe="float8_rowwise",
    *,
    kernel: str = "auto",
    name: str = "grouped_mm",
) -> torch.Tensor:
    """y[e] = x[e] @ w[e].T for each expert's run of tokens, with `recipe`'s quantized
    forward, dgrad and wgrad grouped GEMMs (spec §10); differentiable in x and w.

    Args:
      x: (T, K) float32/bfloat16/float16, the tokens sorted by expert.
      w: (E, N, K), the expert weights, each stored as an `nn.Linear` weight.
      offs: (E,) int32, cumulative end offsets of the experts' tokens, ending at T.
      recipe: a `lowp.Recipe` or its name ("float8_rowwise", "float8_tensorwise",
        "mxfp8", and their "_gw_hp" forms).
      kernel: "auto" (`torch._scaled_grouped_mm` where it runs, else emulated),
        "scaled_grouped_mm" (ValueError where it cannot run) or "emulated".

    Returns:
      y (T, N) in x's dtype; dx in x's dtype and dw in w's under backward.

    >>> import torch, lowp_torch
    >>> x, w = torch.randn(6, 32), torch.randn(2, 64, 32)
    >>> y = lowp_torch.grouped_mm(x, w, torch.tensor([2, 6], dtype=torch.int32), "mxfp8")
    >>> tuple(y.shape)
    (6, 64)
    """
    if kernel not in KERNELS:
        raise ValueError(f"{name}: kernel must be one of {KERNELS}, got {kernel!r}")
    _check(x, w, offs, name)
    plan = extend.GroupedPlan.of(lowp.Recipe.of(recipe))
    try:
        plan.check(w.shape[2], w.shape[1], backward=torch.is_grad_enabled())
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from e
    with torch.autocast(x.device.type, enabled=False):
        return _GroupedMMFunction.apply(x, w, offs, plan, kernel, name)


def grouped_operands(x, w, g, offs, recipe) -> dict:
    """The quantized operands of the three grouped GEMMs `recipe` runs, as (codes,
    scale) pairs of the operand as the GEMM reads it: {"forward": (x, w), "dgrad":
    (g, w.T), "wgrad": (g.T, x.T)}, None for a GEMM in high precision. The bytes
    `grouped_mm` feeds its GEMMs, for comparison with `extend.quantize_grouped`."""
    _check(x, w, offs, "grouped_operands")
    plan = extend.GroupedPlan.of(lowp.Recipe.of(recipe))
    sizes = group_sizes(offs, x.shape[0])
    tensors = {"x": x, "w": w, "g": g, "w.T": w.transpose(-2, -1), "g.T": g, "x.T": x}
    # g's two operands as the backward makes them, both at once where it does
    g_ops = (
        _dy_operands(g.contiguous(), plan, sizes, offs, "grouped_operands")
        if plan.dgrad is not None and plan.wgrad is not None
        else {}
    )
    out: dict = {}
    for name in ("forward", "dgrad", "wgrad"):
        gemm = getattr(plan, name)
        if gemm is None:
            out[name] = None
            continue
        a = g_ops.get(name) or quantize_operand(tensors[gemm.a.tensor], gemm.a, sizes, offs=offs)
        out[name] = (a, quantize_operand(tensors[gemm.b.tensor], gemm.b, sizes, offs=offs))
    return out


def quantized_grouped_mm(x, wq, offs, activation=None, *, name: str = "grouped_mm"):
    """Inference: y[e] = x[e] @ w[e].T with w a QuantizedTensor (E, N, K) quantized along K
    per expert (AxisScaling or MXScaling: one scale never covers two experts), and x
    quantized at the call with `activation` (a rows operand, spec §10), or not at all
    (weight-only: the dequantized weights in float32). No gradient."""
    if not isinstance(wq, _qtensor.QuantizedTensor) or wq.dim() != 3:
        raise TypeError(f"{name}: expected a 3-D QuantizedTensor (E, N, K), got {wq!r:.80}")
    w_scheme = _qtensor.scheme_of(wq)
    if isinstance(w_scheme, lowp.TensorScaling):
        raise ValueError(  # noqa: TRY004 - a valid scheme, not one for experts
            f"{name}: {w_scheme} has one scale for every expert; quantize expert weights "
            "rowwise or with MX blocks (one scale never covers two experts)"
        )
    extend.check_grouped_scheme(w_scheme, "experts")
    _check(x, wq, offs, name)
    sizes, aligned = _routing(offs, x.shape[0])
    w_op = extend.GroupedOperand("w", "experts", w_scheme)
    b = (wq.codes, wq.scale)
    with torch.no_grad():
        if activation is None:
            wv = dequantize_operand(*b, w_op, sizes)
            return _grouped_f32(x.float(), wv, offs).to(x.dtype)
        x_op = extend.GroupedOperand("x", "rows", activation)
        extend.check_grouped_scheme(activation, "rows")
        gemm = extend.GroupedGemm("forward", x_op, w_op, fast_accum=True)
        a = quantize_operand(x, x_op, sizes, f"{name}: x")
        return _product(gemm, a, b, sizes, offs, aligned, x.dtype, "auto", name)
