"""`ragged_dot`: `jax.lax.ragged_dot` with a lowp recipe's grouped GEMMs (spec §10).

For lhs (M, K), the tokens sorted by group (expert), rhs (G, K, N) and group_sizes (G,),
`ragged_dot(lhs, rhs, group_sizes, recipe=...)` computes out[e] = lhs[e] @ rhs[e] for
each group's run of rows, with a custom VJP whose dgrad and wgrad are grouped GEMMs
too. The operands are those of the core's `GroupedPlan`, in its terms: x = lhs,
w = rhs transposed to (G, N, K) (an `nn.Linear` weight per expert, as lowp_torch's),
quantized along each GEMM's reduction axis with no scale covering two experts; their
bytes are `extend.quantize_grouped`'s and lowp_torch's.

Groups of routed extent (the wgrad's scales along the tokens, tensorwise scales per
expert) pair each element with its group's amax (a `segment_max`) and quantize the
pairs with `extend.pair_scheme`: static shapes, so it traces under `jit` and `grad`.
The GEMMs are emulated: dequantized operands multiplied by `jax.lax.ragged_dot` in
float32, rounded once to the output dtype.
"""

import functools

import jax
import jax.numpy as jnp

import lowp
from lowp import extend
from lowp_jax import _quantize


def _segments(sizes, tokens: int, block: int | None):
    """Each token's expert, or its MX block's slot (`extend.token_segments`)."""
    experts = sizes.shape[0]
    expert = jnp.repeat(jnp.arange(experts), sizes, total_repeat_length=tokens)
    if block is None:
        return expert
    starts = jnp.cumsum(sizes) - sizes
    blocks = (sizes + (block - 1)) // block
    first_slot = jnp.cumsum(blocks) - blocks
    within = jnp.arange(tokens) - starts[expert]
    return first_slot[expert] + within // block


def _segment_quantize(t, seg, segments: int, scheme, whole_rows: bool, name: str):
    """(codes shaped like t, scales (segments, C) or (segments, 1) for whole rows) of
    t (T, C), one group per segment of rows (and column, unless whole_rows): each
    element paired with its group's amax, quantized with `extend.pair_scheme`."""
    xf = jnp.asarray(t).astype(jnp.float32)
    absb = jax.lax.bitcast_convert_type(xf, jnp.int32) & 0x7FFFFFFF
    if whole_rows:
        absb = jnp.max(absb, axis=1, keepdims=True, initial=0)
    amax = jnp.maximum(jax.ops.segment_max(absb, seg, num_segments=segments), 0)
    a = jax.lax.bitcast_convert_type(amax, jnp.float32)
    pair = extend.pair_scheme(scheme)
    # A is the magnitude of one of t's elements: exact in t's dtype.
    hp = jnp.asarray(t)
    stacked = jnp.stack([hp, jnp.broadcast_to(a[seg].astype(hp.dtype), hp.shape)], -1)
    codes = _quantize.quantize(stacked, pair, name=name).codes[..., 0]
    scale = _quantize.quantize(jnp.stack([a, a], -1), pair, name=name).scale[..., 0]
    return codes, scale


def quantize_operand(t, op, sizes, name: str = "input"):
    """(codes, scale) of a grouped operand as the GEMM reads it: the bytes of
    `extend.quantize_grouped(t, op.scheme, sizes, op.kind)`. t: (T, C) token-major for
    "rows" and "tokens" (whose operand is t.T), (E, R, C) for "experts"."""
    scheme, kind = op.scheme, op.kind
    tensorwise = isinstance(scheme, lowp.TensorScaling)
    if kind == "experts":
        if tensorwise:  # one scale per expert: a row of the flattened experts
            axis = lowp.AxisScaling(scheme.fmt, -1, scheme.pow2)
            q = _quantize.quantize(t.reshape(t.shape[0], -1), axis, name=name)
            return q.codes.reshape(t.shape), q.scale.reshape(-1)
        q = _quantize.quantize(t, scheme, name=name)
        return q.codes, q.scale
    if kind == "rows" and not tensorwise:
        q = _quantize.quantize(t, scheme, name=name)
        return q.codes, q.scale
    tokens, experts = t.shape[0], sizes.shape[0]
    block = scheme.block if scheme.family == "mx" else None
    seg = _segments(sizes, tokens, block)
    segments = experts if block is None else extend.token_capacity(tokens, experts, block)
    codes, scale = _segment_quantize(t, seg, segments, scheme, tensorwise, name)
    if tensorwise:
        return (codes if kind == "rows" else codes.T), scale.reshape(-1)
    return codes.T, scale.T


def _scale_values(scale, scheme):
    """float32 scale values; an e8m0 byte s is 2^(s - 127), built from exponent bits
    (byte 0, 2^-127, reads as 0: a subnormal no GEMM emulation needs; 0xFF as Inf, so
    a poisoned group's code 0 gives NaN)."""
    if scheme.family == "mx":
        return jax.lax.bitcast_convert_type(scale.astype(jnp.int32) << 23, jnp.float32)
    return scale.astype(jnp.float32)


def dequantize_operand(codes, scale, op, sizes):
    """The float32 values of a grouped operand (the GEMM emulation's input)."""
    values = codes.astype(jnp.float32)
    s = _scale_values(scale, op.scheme)
    tensorwise = isinstance(op.scheme, lowp.TensorScaling)
    block = op.scheme.block if op.scheme.family == "mx" else None
    if op.kind == "experts":
        if tensorwise:
            return values * s[:, None, None]
        return values * (s if block is None else jnp.repeat(s, block, axis=-1))
    tokens = codes.shape[0] if op.kind == "rows" else codes.shape[1]
    expert = _segments(sizes, tokens, None)
    if op.kind == "rows":
        if tensorwise:
            return values * s[expert][:, None]
        return values * (s if block is None else jnp.repeat(s, block, axis=-1))
    if tensorwise:
        return values * s[expert][None, :]
    return values * s[:, _segments(sizes, tokens, block) if block else expert]


def _rows_by_experts(a, b, sizes):
    """float32 out[t] = a[t] @ b[e(t)].T for token-major a (T, R), b (E, C, R)."""
    return jax.lax.ragged_dot(
        a,
        jnp.swapaxes(b, 1, 2),
        sizes,
        precision=jax.lax.Precision.HIGHEST,
        preferred_element_type=jnp.float32,
    )


def _wgrad(g, x, sizes):
    """float32 dw[e] = g[e].T @ x[e] for token-major g (T, N), x (T, K): (E, N, K), the
    transpose of ragged_dot with respect to its rhs."""
    experts = sizes.shape[0]

    def forward(rhs):
        return jax.lax.ragged_dot(
            x,
            rhs,
            sizes,
            precision=jax.lax.Precision.HIGHEST,
            preferred_element_type=jnp.float32,
        )

    zeros = jnp.zeros((experts, x.shape[1], g.shape[1]), jnp.float32)
    (d_rhs,) = jax.vjp(forward, zeros)[1](g.astype(jnp.float32))
    return jnp.swapaxes(d_rhs, 1, 2)


def _product(gemm, a, b, sizes, out_dtype):
    """One quantized grouped GEMM of the plan, emulated."""
    av = dequantize_operand(*a, gemm.a, sizes)
    bv = dequantize_operand(*b, gemm.b, sizes)
    if gemm.name == "wgrad":
        return _wgrad(av.T, bv.T, sizes).astype(out_dtype)
    return _rows_by_experts(av, bv, sizes).astype(out_dtype)


def _forward(plan, lhs, rhs, group_sizes):
    w = jnp.swapaxes(rhs, 1, 2)
    fwd = plan.forward
    a = quantize_operand(lhs, fwd.a, group_sizes, "ragged_dot forward: lhs")
    b = quantize_operand(w, fwd.b, group_sizes, "ragged_dot forward: rhs")
    return _product(fwd, a, b, group_sizes, lhs.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _ragged(plan, lhs, rhs, group_sizes):
    return _forward(plan, lhs, rhs, group_sizes)


def _ragged_fwd(plan, lhs, rhs, group_sizes):
    return _forward(plan, lhs, rhs, group_sizes), (lhs, rhs, group_sizes)


def _ragged_bwd(plan, residuals, dy):
    lhs, rhs, sizes = residuals
    w = jnp.swapaxes(rhs, 1, 2)  # (E, N, K)
    if plan.dgrad is None:
        dx = _rows_by_experts(dy.astype(jnp.float32), jnp.swapaxes(w, 1, 2), sizes)
    else:
        a = quantize_operand(dy, plan.dgrad.a, sizes, "ragged_dot dgrad: dy")
        b = quantize_operand(rhs, plan.dgrad.b, sizes, "ragged_dot dgrad: w.T")
        dx = _product(plan.dgrad, a, b, sizes, jnp.float32)
    if plan.wgrad is None:
        dw = _wgrad(dy.astype(jnp.float32), lhs.astype(jnp.float32), sizes)
    else:
        a = quantize_operand(dy, plan.wgrad.a, sizes, "ragged_dot wgrad: dy.T")
        b = quantize_operand(lhs, plan.wgrad.b, sizes, "ragged_dot wgrad: x.T")
        dw = _product(plan.wgrad, a, b, sizes, jnp.float32)
    d_rhs = jnp.swapaxes(dw, 1, 2).astype(rhs.dtype)
    return dx.astype(lhs.dtype), d_rhs, None


_ragged.defvjp(_ragged_fwd, _ragged_bwd)


def ragged_dot(
    lhs,
    rhs,
    group_sizes,
    precision=None,
    preferred_element_type=None,
    group_offset=None,
    *,
    recipe="float8_rowwise",
):
    """`jax.lax.ragged_dot(lhs, rhs, group_sizes)` with `recipe`'s quantized grouped
    GEMMs (spec §10): forward here, dgrad and wgrad in its VJP. jit- and grad-safe.

    Args:
      lhs: (M, K) float32/bfloat16/float16, the tokens sorted by group.
      rhs: (G, K, N), one matrix per group.
      group_sizes: (G,) integer, the rows of each group, summing to M (checked when
        concrete).
      precision: ignored but for the default (the GEMMs are emulated in float32).
      preferred_element_type: the output dtype (default: lhs's).
      group_offset: must be None (no sharded groups yet).
      recipe: a `lowp.Recipe` or its name.

    >>> import jax.numpy as jnp, lowp_jax
    >>> out = lowp_jax.ragged_dot(jnp.ones((6, 32)), jnp.ones((2, 32, 64)),
    ...                           jnp.array([2, 4]), recipe="mxfp8")
    >>> out.shape
    (6, 64)
    """
    if group_offset is not None:
        raise ValueError("lowp_jax.ragged_dot: group_offset is not supported, got one")
    lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
    if lhs.ndim != 2 or rhs.ndim != 3 or lhs.shape[1] != rhs.shape[1]:
        raise ValueError(
            f"ragged_dot takes lhs (M, K) and rhs (G, K, N), got {lhs.shape}, {rhs.shape}"
        )
    group_sizes = jnp.asarray(group_sizes)
    if group_sizes.shape != (rhs.shape[0],) or not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        raise ValueError(
            f"ragged_dot: group_sizes must be ({rhs.shape[0]},) integers, "
            f"got {group_sizes.dtype}{group_sizes.shape}"
        )
    if not isinstance(group_sizes, jax.core.Tracer):
        extend.check_group_sizes(jax.device_get(group_sizes), lhs.shape[0])
    plan = extend.GroupedPlan.of(lowp.Recipe.of(recipe))
    plan.check(lhs.shape[1], rhs.shape[2])
    out = _ragged(plan, lhs, rhs, group_sizes.astype(jnp.int32))
    return out if preferred_element_type is None else out.astype(preferred_element_type)


def grouped_operands(x, w, g, group_sizes, recipe) -> dict:
    """The quantized operands of the three grouped GEMMs, in the core's terms: x (T, K),
    w (E, N, K), g (T, N); {"forward": (x, w), "dgrad": (g, w.T), "wgrad": (g.T, x.T)}
    of (codes, scale), None for a GEMM in high precision (as lowp_torch's)."""
    plan = extend.GroupedPlan.of(lowp.Recipe.of(recipe))
    sizes = jnp.asarray(group_sizes).astype(jnp.int32)
    tensors = {"x": x, "w": w, "g": g, "w.T": jnp.swapaxes(w, 1, 2), "g.T": g, "x.T": x}
    out: dict = {}
    for name in ("forward", "dgrad", "wgrad"):
        gemm = getattr(plan, name)
        out[name] = (
            None
            if gemm is None
            else tuple(
                quantize_operand(jnp.asarray(tensors[op.tensor]), op, sizes)
                for op in (gemm.a, gemm.b)
            )
        )
    return out
