"""GEMM lowering: `scaled_matmul(a, b)` = a @ b.T for quantized operands, on the best kernel.

Both operands are stored with the reduction axis K last, as lowp's recipes write every
GEMM (`lowp/_recipes.py`): a is the activation (M, K), b the weight (N, K) as
`nn.Linear` stores it. cuBLAS's fp8 GEMMs want A row-major and B column-major, and
the weight's codes transposed as a view, `b.codes.t()`, are exactly that.

The kernels, one branch each in `scaled_matmul`:

- "scaled_mm": `torch._scaled_mm` on CUDA sm_89+ for tensorwise x tensorwise and rowwise
  x rowwise float8 (scales are the stored decode scales d: `_scaled_mm` multiplies by
  them, spec §3.1; a tensorwise operand beside a rowwise one runs as rowwise, its scale
  repeated per row); 1x128 x 128x128 (or 1x128 x 1x128) block scales on sm_90 (cuBLAS >=
  12.9); MX and NVFP4 block-scaled GEMMs through `torch.nn.functional.scaled_mm` on
  sm_100+, scales in the cublas_blocked layout (spec §5).
- "fbgemm": `torch.ops.fbgemm.f8f8bf16` (tensorwise), `f8f8bf16_rowwise` and
  `f8f8bf16_rowwise_batched` when fbgemm-gpu-genai imports (sm_90+, bfloat16 out).
- "emulated": dequantize both operands to float32, matmul in float32, add the bias in
  float32, round once to the output dtype. Every scheme pair, every device.

`kernel="auto"` takes the first of scaled_mm, fbgemm that can run and logs why at
debug level (`logging.getLogger("lowp_torch")`), else emulates. A shape the fp8
kernels refuse (K or N not a multiple of 16) is padded when `pad_to_16=True`; without
it, an explicitly requested kernel raises a ValueError naming the layer and the dim,
and "auto" emulates and logs a WARNING once per layer: the layer stays quantized with
the same numerics (within spec §7's GEMM bound), only slower, and says so.
"""

import functools
import math

import torch
import torch.nn.functional as F

import lowp
from lowp_torch import _cast_kernels, _config, _log, _qtensor, _quantize, _storage, _weight_cache

_FP8 = ("float8_e4m3fn", "float8_e5m2")
_E4M3 = "float8_e4m3fn"
# The rowwise kernels take rowwise operands along K, or one tensorwise operand beside a
# rowwise one (float8_rowwise_gw_hp's dgrad), its scale repeated per row (`_row_scales`).
_ROWWISE = (lowp.AxisScaling, lowp.TensorScaling)


def scaled_matmul(
    a: _qtensor.QuantizedTensor,
    b: _qtensor.QuantizedTensor,
    *,
    out_dtype: torch.dtype | None = None,
    bias: torch.Tensor | None = None,
    kernel: str = "auto",
    fast_accum: bool = False,
    pad_to_16: bool = False,
    name: str = "scaled_matmul",
    dim_names: tuple[str, str] = ("in_features", "out_features"),
) -> torch.Tensor:
    """`a @ b.T + bias` for quantized a (M, K) and b (N, K), or batched (B, M, K), (B, N, K).

    Args:
      a, b: QuantizedTensors, reduction axis last (for rowwise/MX/NVFP4 the scale
        groups run along K). Any scheme pair runs emulated; the kernels take the pairs
        listed in this module's docstring.
      out_dtype: float32, bfloat16 or float16; default a.hp_dtype (the activation's).
      bias: (N,), added in float32 before the one rounding to out_dtype: in the
        kernel's epilogue where it takes one (scaled_mm tensorwise and rowwise with a
        bias of the 16-bit output dtype; fbgemm rowwise), else to the kernel's float32
        output (emulated, a float32 bias or output, cuBLAS block scaling). fbgemm's
        tensorwise f8f8bf16 has neither a bias input nor a float32 output: there the
        bias is added to the rounded bfloat16 output, which rounds a second time.
      kernel: "auto", "scaled_mm", "fbgemm" or "emulated".
      fast_accum: Hopper's fast fp8 accumulation (tensorwise/rowwise kernels only).
      pad_to_16: zero-pad K and N to multiples of 16 for the fp8 kernels.
      name: the layer, for errors and logs.
      dim_names: what the caller calls K and N, for the shape messages (a linear's
        forward: in_features, out_features; its wgrad: the tokens, in_features).

    Returns:
      A plain tensor (..., M, N) of out_dtype on the operands' device.

    >>> import torch, lowp, lowp_torch
    >>> a = lowp_torch.quantize(torch.ones(2, 32), lowp.AxisScaling())
    >>> b = lowp_torch.quantize(torch.full((3, 32), 0.5), lowp.AxisScaling())
    >>> scaled_matmul(a, b).tolist()
    [[16.0, 16.0, 16.0], [16.0, 16.0, 16.0]]
    """
    _check_operands(a, b, name)
    out_dtype = a.hp_dtype if out_dtype is None else out_dtype
    if out_dtype not in _storage.HP_DTYPES:
        raise ValueError(
            f"{name}: out_dtype must be one of {tuple(_storage.HP_DTYPES)}, got {out_dtype}"
        )
    form = gemm_form(a, b)
    if kernel == "auto":
        kernel = _choose_kernel(a, b, form, out_dtype, pad_to_16, name, dim_names)
    elif kernel in ("scaled_mm", "fbgemm"):
        why = kernel_problem(kernel, a, b, form, out_dtype)
        if why is None and not (pad_to_16 and form in ("tensorwise", "rowwise", "block")):
            why = shape_problem(a, b, dim_names)
            why = why and f"{why} (pass pad_to_16=True to zero-pad it, or kernel='emulated')"
        if why is not None:
            raise ValueError(f"{name}: kernel={kernel!r} cannot run this GEMM: {why}")
    elif kernel != "emulated":
        raise ValueError(f"{name}: kernel must be one of {_config.KERNELS}, got {kernel!r}")

    if kernel == "emulated":
        # In float32 under autocast too, which would lower the matmul to its dtype. The
        # dequantized operands are made contiguous: the same codes saved in another layout
        # (a transposed view of codes kept from quantize_both) would otherwise let the
        # BLAS pick another kernel, and another summation order, for the same product.
        with torch.autocast(a.device.type, enabled=False):
            y = torch.matmul(
                _quantize.dequantize(a, torch.float32).contiguous(),
                _weight_cache.dequantized(b, torch.float32).contiguous().transpose(-1, -2),
            )
            if bias is not None:  # in place: y is the matmul's fresh float32 output
                y.add_(bias.to(torch.float32))
            return y.to(out_dtype)
    elif kernel == "scaled_mm" and form in ("mx", "nvfp4"):
        return _block_scaled_mm(a, b, form, out_dtype, bias)
    elif kernel == "scaled_mm":
        a_codes, b_codes, a_scale, b_scale, n = _padded_operands(a, b, form, pad_to_16)
        # A bias of the output's 16-bit dtype goes to the kernel's float32 epilogue
        # (added before the one rounding). Otherwise (a float32 bias, a float32 output,
        # cuBLAS's block-scaled path, which takes no bias) the kernel writes float32 and
        # the bias is added to that, so the result is still rounded once.
        epilogue_bias = (
            bias is not None and bias.dtype == out_dtype != torch.float32 and form != "block"
        )
        kernel_dtype = out_dtype if bias is None or epilogue_bias else torch.float32
        y = torch._scaled_mm(
            a_codes,
            b_codes.t(),
            scale_a=a_scale,
            scale_b=b_scale,
            bias=_pad_bias(bias, b_codes.shape[0] - n) if epilogue_bias else None,
            out_dtype=kernel_dtype,
            use_fast_accum=fast_accum
            and form != "block",  # cuBLAS block scaling: exact accumulation
        )
        if y.shape[1] != n:
            y = y[:, :n]
        if bias is None or epilogue_bias:
            return y
        return (y + bias.to(torch.float32)).to(out_dtype)
    elif kernel == "fbgemm":
        a_codes, b_codes, a_scale, b_scale, n = _padded_operands(a, b, form, pad_to_16)
        ops = torch.ops.fbgemm
        if form == "tensorwise":
            scale = a_scale * b_scale
            if _fbgemm_takes_float_scale():  # some builds declare `float scale`: a host sync
                scale = float(scale)
            y = ops.f8f8bf16(a_codes, b_codes, scale, use_fast_accum=fast_accum)
        else:
            # The rowwise kernels add a float32 bias before their one rounding; a
            # bfloat16 bias they add after it (measured on the H200: one bf16 ulp past
            # the §7 bound), so the bias always goes in as float32.
            bias_in = None
            if bias is not None:
                bias_in = _pad_bias(bias.to(torch.float32), b_codes.shape[-2] - n)
            if b_codes.dim() == 2:
                y = ops.f8f8bf16_rowwise(
                    a_codes,
                    b_codes,
                    a_scale.reshape(-1),
                    b_scale.reshape(-1),
                    bias=bias_in,
                    use_fast_accum=fast_accum,
                )
            else:
                batch = b_codes.shape[0]
                y = ops.f8f8bf16_rowwise_batched(
                    a_codes,
                    b_codes,
                    a_scale.reshape(batch, -1),
                    b_scale.reshape(batch, -1),
                    bias=bias_in,
                    use_fast_accum=fast_accum,
                )
        y = y[..., :n]
        if bias is None or form == "rowwise":
            return y
        return (y.to(torch.float32) + bias.to(torch.float32)).to(out_dtype)  # f8f8bf16 has no bias
    raise ValueError(f"{name}: unknown kernel {kernel!r}")


def gemm_form(a, b) -> str | None:
    """Which scaled-GEMM family the scheme pair belongs to, or None (emulation only)."""
    return form_of(_qtensor.scheme_of(a), a.dim(), _qtensor.scheme_of(b), b.dim())


def form_of(sa, a_dim: int, sb, b_dim: int) -> str | None:
    """`gemm_form` of operands of schemes `sa`, `sb` and ranks `a_dim`, `b_dim`, before
    they are quantized."""
    last_a = getattr(sa, "axis", -1) % a_dim == a_dim - 1
    last_b = getattr(sb, "axis", -1) % b_dim == b_dim - 1
    fp8 = sa.fmt in _FP8 and sb.fmt in _FP8 and (sa.fmt, sb.fmt) != ("float8_e5m2",) * 2
    if isinstance(sa, lowp.TensorScaling) and isinstance(sb, lowp.TensorScaling) and fp8:
        return "tensorwise"
    if isinstance(sa, _ROWWISE) and isinstance(sb, _ROWWISE):  # not both tensorwise, here
        return "rowwise" if fp8 and last_a and last_b else None
    if isinstance(sa, lowp.BlockScaling) and isinstance(sb, lowp.BlockScaling):
        blocks_fit = sa.block == (1, 128) and sb.block in ((128, 128), (1, 128))
        return "block" if fp8 and blocks_fit else None
    if isinstance(sa, lowp.MXScaling) and isinstance(sb, lowp.MXScaling):
        same_kind = fp8 or sa.fmt == sb.fmt == "float4_e2m1fn"
        return "mx" if same_kind and sa.block == sb.block == 32 and last_a and last_b else None
    if isinstance(sa, lowp.NVFP4Scaling) and isinstance(sb, lowp.NVFP4Scaling):
        ok = sa.block == sb.block == 16 and sa.global_scale == sb.global_scale and last_a and last_b
        return "nvfp4" if ok else None
    return None


def kernel_problem(kernel: str, a, b, form: str | None, out_dtype: torch.dtype) -> str | None:
    """Why `kernel` cannot run a @ b.T here, or None if it can (shape rules aside)."""
    if a.device.type != "cuda":
        return f"the operands are on {a.device.type}, and {kernel} kernels run on CUDA"
    major, minor = _cuda_capability(a.device.index)
    sm = f"sm_{major}{minor}"
    if form is None:
        return f"{_qtensor.scheme_of(a)} x {_qtensor.scheme_of(b)} has no scaled-GEMM kernel (pairs: tensorwise, rowwise along K, 1x128 x 128x128 blocks, MX, NVFP4)"
    if kernel == "scaled_mm":
        if a.dim() != 2 or b.dim() != 2:
            return "torch._scaled_mm multiplies 2-D operands only"
        if form in ("tensorwise", "rowwise"):
            if (major, minor) < (8, 9):
                return f"fp8 torch._scaled_mm needs sm_89+, this GPU is {sm}"
            if form == "rowwise" and (major, minor) != (9, 0) and out_dtype != torch.bfloat16:
                return f"rowwise torch._scaled_mm writes bfloat16 only on {sm} (cuBLAS rowwise is sm_90)"
        elif form == "block":
            if major != 9:
                return f"1x128/128x128 block-scaled torch._scaled_mm runs on sm_90 only, this GPU is {sm}"
            m, k = a.shape
            if m % 4 or math.ceil(k / 128) % 4:
                return (
                    f"block scales need 16-byte aligned strides: M={m} and ceil(K/128)="
                    f"{math.ceil(k / 128)} must be multiples of 4"
                )
        elif form in ("mx", "nvfp4"):
            if major < 10:
                return f"block-scaled {form} GEMMs need sm_100+, this GPU is {sm}"
            if not hasattr(F, "scaled_mm"):
                return f"{form} GEMMs need torch.nn.functional.scaled_mm, which torch {torch.__version__} lacks"
            if out_dtype != torch.bfloat16:
                return f"block-scaled {form} GEMMs write bfloat16 here, not {out_dtype}"
        return None
    if kernel == "fbgemm":
        if major < 9:
            return f"fbgemm's f8f8bf16 kernels need sm_90+, this GPU is {sm}"
        missing = _fbgemm_missing()
        if missing:
            return missing
        if form not in ("tensorwise", "rowwise") or (
            _qtensor.scheme_of(a).fmt,
            _qtensor.scheme_of(b).fmt,
        ) != (_E4M3, _E4M3):
            return "fbgemm's f8f8bf16 kernels take tensorwise or rowwise float8_e4m3fn operands"
        if out_dtype != torch.bfloat16:
            return f"fbgemm's f8f8bf16 kernels write bfloat16, not {out_dtype}"
        if a.dim() != b.dim() or b.dim() not in (2, 3) or (b.dim() == 3 and form != "rowwise"):
            return "fbgemm takes 2-D operands, or 3-D rowwise ones (f8f8bf16_rowwise_batched)"
        return None
    raise ValueError(f"unknown kernel {kernel!r}")


def shape_problem(a, b, dim_names=("in_features", "out_features")) -> str | None:
    """The fp8 kernels' 16-byte alignment rule: K and N multiples of 16 (M is free)."""
    k, n = a.shape[-1], b.shape[-2]
    if k % 16:
        return f"K={k} ({dim_names[0]}) is not a multiple of 16, which the fp8 kernels need"
    if n % 16:
        return f"N={n} ({dim_names[1]}) is not a multiple of 16, which the fp8 kernels need"
    return None


# --- helpers ---


def _check_operands(a, b, name: str) -> None:
    for role, q in (("a", a), ("b", b)):
        if not isinstance(q, _qtensor.QuantizedTensor):
            raise TypeError(
                f"{name}: {role} must be a lowp_torch.QuantizedTensor, got {type(q).__name__}"
            )
    if a.dim() < 2 or b.dim() not in (2, 3) or (b.dim() == 3 and a.dim() != 3):
        raise ValueError(
            f"{name}: a must be (..., M, K) and b (N, K), or both batched (B, M, K), (B, N, K); "
            f"got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    if a.shape[-1] != b.shape[-1] or (b.dim() == 3 and a.shape[0] != b.shape[0]):
        raise ValueError(
            f"{name}: a {tuple(a.shape)} and b {tuple(b.shape)} do not multiply as a @ b.T"
        )
    if a.device != b.device:
        raise ValueError(f"{name}: a is on {a.device}, b on {b.device}")


def _choose_kernel(a, b, form, out_dtype, pad_to_16: bool, name: str, dim_names) -> str:
    """kernel="auto": the first kernel that can run, with the reasons logged."""
    notes = []
    for kernel in ("scaled_mm", "fbgemm"):
        why = kernel_problem(kernel, a, b, form, out_dtype)
        if why is None:
            shape_why = shape_problem(a, b, dim_names)
            if shape_why is None or (pad_to_16 and form in ("tensorwise", "rowwise", "block")):
                padded = "" if shape_why is None else f" (zero-padded: {shape_why})"
                _log.debug(
                    f"{name}: kernel={kernel!r} for {form} operands{padded}; skipped: {notes or 'none'}"
                )
                return kernel
            _log.warn_once(
                f"shape:{name}:{tuple(a.shape)}x{tuple(b.shape)}",
                f"{name}: {shape_why}, so this {form} GEMM runs emulated (dequantize, float32 "
                f"matmul); pad_to_16=True (quantize_, convert_to_training) pads it for {kernel}",
            )
            why = shape_why
        notes.append(f"{kernel}: {why}")
    _log.debug(lambda: f"{name}: kernel='emulated' because " + "; ".join(notes))
    return "emulated"


def _padded_operands(a, b, form: str, pad: bool):
    """Codes and scales as the fp8 kernels take them, zero-padded to K, N % 16 == 0.

    Zero codes contribute nothing, whatever their scale, so padding is exact; the
    block-scale counts ceil(K/128) and ceil(N/128) do not change when K, N round up
    to a multiple of 16, and padded rowwise scales are 1.
    """
    k, n = a.shape[-1], b.shape[-2]
    pad_k = (-k % 16) if pad else 0
    pad_n = (-n % 16) if pad else 0
    a_codes, a_scale = a_operand(a, form, pad_k)
    b_codes, b_scale = b_operand(b, form, pad_k, pad_n)
    return a_codes, b_codes, a_scale, b_scale, n


def a_operand(a, form: str, pad_k: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales) of the activation a (M, K) as the fp8 kernels take them
    (`_padded_operands`), K zero-padded by pad_k."""
    a_codes = _cast_kernels.contiguous(_pad_codes(a.codes, (0, pad_k)))
    if form == "tensorwise":
        return a_codes, a.scale
    if form == "rowwise":
        return a_codes, _row_scales(a).unsqueeze(-1)  # (M, 1): one per row of a
    if form == "block":
        # torch._scaled_mm wants 1x128 scales outer-dim-major (M, K/128) with strides
        # (1, M).
        return a_codes, a.scale.t().contiguous().t()
    raise ValueError(f"no fp8 kernel operands for {form}")


def b_operand(b, form: str, pad_k: int = 0, pad_n: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales) of the weight b (N, K) as the fp8 kernels take them
    (`_padded_operands`), K and N zero-padded by pad_k, pad_n; a constant of an
    inference layer, which `_linear` keeps between calls."""
    b_codes = _cast_kernels.contiguous(_pad_codes(b.codes, (0, pad_k, 0, pad_n)))
    if form == "tensorwise":
        return b_codes, b.scale
    if form == "rowwise":
        return b_codes, _pad_scales(_row_scales(b).unsqueeze(-2), (0, pad_n))  # (1, N)
    if form == "block":
        # a 128x128 weight's (N/128, K/128) scales seen transposed
        if _qtensor.scheme_of(b).block == (128, 128):
            return b_codes, b.scale.contiguous().t()
        return b_codes, _pad_scales(b.scale, (0, 0, 0, pad_n)).t().contiguous()
    raise ValueError(f"no fp8 kernel operands for {form}")


def _pad_scales(scale: torch.Tensor, widths: tuple[int, ...]) -> torch.Tensor:
    """Scales padded with 1.0 (F.pad copies even when every width is 0: a launch)."""
    return F.pad(scale, widths, value=1.0) if any(widths) else scale


def _row_scales(q) -> torch.Tensor:
    """One decode scale per row of q, shaped q.shape[:-1]: its rowwise scales, or its
    tensorwise scale repeated (cuBLAS has no tensorwise x rowwise kernel; torchao
    repeats the scale the same way for this pair)."""
    if isinstance(_qtensor.scheme_of(q), lowp.TensorScaling):
        return q.scale.expand(q.shape[:-1]).contiguous()
    return q.scale.reshape(q.shape[:-1])


def _pad_bias(bias: torch.Tensor, pad_n: int) -> torch.Tensor:
    return F.pad(bias, (0, pad_n)) if pad_n else bias


def _pad_codes(codes: torch.Tensor, widths: tuple[int, ...]) -> torch.Tensor:
    if not any(widths):
        return codes
    return _storage.as_stored(F.pad(_storage.as_bytes(codes), widths), codes.dtype)  # byte 0 = +0.0


def _block_scaled_mm(a, b, form: str, out_dtype, bias):
    """MX / NVFP4 on sm_100+: F.scaled_mm with swizzled (cublas_blocked) scales."""
    from torch.nn.functional import ScalingType, SwizzleType

    a_blocked, b_blocked = (
        _qtensor.with_scale_layout(a, "cublas_blocked"),
        _qtensor.with_scale_layout(b, "cublas_blocked"),
    )
    swizzle = SwizzleType.SWIZZLE_32_4_4
    if form == "mx":
        scale_a, scale_b = a_blocked.scale, b_blocked.scale
        recipe, swizzles = ScalingType.BlockWise1x32, swizzle
    elif a.global_scale is None:
        scale_a, scale_b = a_blocked.scale, b_blocked.scale
        recipe, swizzles = ScalingType.BlockWise1x16, swizzle
    else:  # NVFP4's two levels: e4m3 block scales, then the float32 global decode scales
        scale_a, scale_b = [a_blocked.scale, a.global_scale], [b_blocked.scale, b.global_scale]
        recipe = [ScalingType.BlockWise1x16, ScalingType.TensorWise]
        swizzles = [swizzle, SwizzleType.NO_SWIZZLE]
    return F.scaled_mm(
        a.codes.contiguous(),
        b.codes.contiguous().t(),
        scale_a,
        recipe,
        scale_b,
        recipe,
        swizzle_a=swizzles,
        swizzle_b=swizzles,
        bias=None if bias is None else bias.to(out_dtype),
        output_dtype=out_dtype,
    )


@torch.compiler.assume_constant_result
def _cuda_capability(index: int | None) -> tuple[int, int]:
    # A constant to torch.compile: the device does not change under a compiled model.
    return _capability_of(torch.cuda.current_device() if index is None else index)


@functools.cache
def _capability_of(index: int) -> tuple[int, int]:
    """Asked on every call of a training layer (`_training.fp8_kernels_run`): one query
    a device, not microseconds of `get_device_capability` per call."""
    return torch.cuda.get_device_capability(index)


_FBGEMM_STATE: list[str] = []  # [reason] once probed: "" if the ops loaded


@torch.compiler.assume_constant_result
def _fbgemm_missing() -> str:
    """ "" if fbgemm-gpu-genai's fp8 GEMMs are registered, else why not (imported lazily,
    once: fbgemm is optional and must never break `import lowp_torch`)."""
    if not _FBGEMM_STATE:
        try:
            import fbgemm_gpu.experimental.gen_ai  # noqa: F401  (registers torch.ops.fbgemm.*)

            ok = all(hasattr(torch.ops.fbgemm, op) for op in ("f8f8bf16", "f8f8bf16_rowwise"))
            _FBGEMM_STATE.append("" if ok else "fbgemm_gpu imported but has no f8f8bf16 ops")
        except (ImportError, OSError, RuntimeError, AttributeError) as e:  # absent, or ABI mismatch
            _FBGEMM_STATE.append(
                f"fbgemm-gpu-genai is not importable ({type(e).__name__}: {e})"[:300]
            )
    return _FBGEMM_STATE[0]


def _fbgemm_takes_float_scale() -> bool:
    schema = torch.ops.fbgemm.f8f8bf16.default._schema
    return str(schema.arguments[2].type) == "float"
