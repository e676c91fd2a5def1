"""Grouped GEMMs of a mixture of experts (spec §10): what each of the three GEMMs reads,
and the NumPy reference of a grouped operand's bytes.

An MoE layer multiplies the tokens routed to expert e, sorted so that each expert's
tokens are one run of rows, by that expert's weight. With x (T, K) the sorted tokens,
w (E, N, K) the stacked expert weights (each an `nn.Linear` weight, (out, in)),
g = dL/dy (T, N) and `group_sizes` (E,) the tokens of each expert (summing to T):

    forward  y[e]  = x[e]   @ w[e].T    a = x   (T, K) rows    b = w   (E, N, K) experts
    dgrad    dx[e] = g[e]   @ w[e]      a = g   (T, N) rows    b = w.T (E, K, N) experts
    wgrad    dw[e] = g[e].T @ x[e]      a = g.T (N, T) tokens  b = x.T (K, T) tokens

where t[e] is the run of rows of expert e. As in the dense plan (`_linear_plan`), each
operand is quantized along its last axis as the GEMM reads it, with the recipe's scheme,
from the high-precision tensor; and no scale is shared by two experts:

  "rows"     a token-major operand scaled along its features: a row's scales are its
             own, except tensorwise scaling, which has one scale per expert's rows.
  "experts"  a stacked weight, quantized per expert (tensorwise: one scale per expert).
  "tokens"   the wgrad's operands, scaled along the tokens *within each expert*: per
             (feature, expert) for float scales, MX blocks of `block` tokens starting at
             each expert's first token. An expert whose token count is not a multiple
             of the block ends in a short block, whose scale is its own elements' (the
             bytes of zero-padding the expert to a whole block, the padding's codes not
             kept). MX scales of the tokens are stored in `capacity` slots per feature,
             expert e's blocks from slot `sum_{j<e} ceil(T_j / block)`; the slots after
             the last expert's hold the scale of an all-zero block. `capacity` depends
             on the shapes only, so a jitted frontend knows it.

The reference is the plain definition: each expert's slice quantized by `lowp.quantize`.
"""

import dataclasses
import math

import numpy as np

from lowp import _qtensor, _quantize, _recipes, _schemes

KINDS = ("rows", "experts", "tokens")
# The operands (a, b) of each grouped GEMM `a @ b.T`: the layer's tensor and its kind.
_OPERANDS = {
    "forward": (("x", "rows"), ("w", "experts")),
    "dgrad": (("g", "rows"), ("w.T", "experts")),
    "wgrad": (("g.T", "tokens"), ("x.T", "tokens")),
}
# Dims of each operand as its GEMM reads it, in the layer's terms (E: experts).
_DIMS = {
    "x": ("T", "K"),
    "w": ("E", "N", "K"),
    "g": ("T", "N"),
    "w.T": ("E", "K", "N"),
    "g.T": ("N", "T"),
    "x.T": ("K", "T"),
}
DIM_NAMES = {"T": "tokens", "K": "in_features", "N": "out_features", "E": "experts"}


# --- group boundaries ---


def group_sizes_from_offs(offs, tokens: int) -> np.ndarray:
    """`group_sizes` (int64) from `offs`, cumulative end offsets (torch._grouped_mm's form):
    ValueError naming them if they decrease, start below 0 or do not end at `tokens`."""
    offs = np.asarray(offs)
    if offs.ndim != 1 or offs.dtype.kind not in "iu":
        raise ValueError(
            f"offs must be a 1-D integer array, got {offs.dtype} of shape {offs.shape}"
        )
    sizes = np.diff(offs.astype(np.int64), prepend=0)
    return check_group_sizes(sizes, tokens, what=f"offs {offs.tolist()}")


def check_group_sizes(group_sizes, tokens: int, *, what: str | None = None) -> np.ndarray:
    """`group_sizes` as int64, the canonical form; ValueError naming them unless they are
    E >= 1 non-negative ints summing to `tokens` (no token is silently left out)."""
    sizes = np.asarray(group_sizes)
    what = what or f"group_sizes {sizes.tolist()}"
    if sizes.ndim != 1 or sizes.size == 0 or sizes.dtype.kind not in "iu":
        raise ValueError(f"{what}: expected a non-empty 1-D integer array (one per expert)")
    sizes = sizes.astype(np.int64)
    if (sizes < 0).any():
        raise ValueError(f"{what}: an expert has a negative token count")
    if int(sizes.sum()) != tokens:
        raise ValueError(
            f"{what}: the experts' tokens sum to {int(sizes.sum())}, the input has {tokens} rows"
        )
    return sizes


def token_capacity(tokens: int, experts: int, block: int) -> int:
    """Scale slots per feature of an MX operand along the tokens: enough for every
    expert's blocks whatever the routing (sum ceil(T_e / block) <= T // block + E)."""
    return tokens // block + experts


def pair_scheme(scheme: _schemes.Scheme) -> _schemes.Scheme:
    """The scheme a frontend quantizes `stack([x, A], -1)` with, A the amax of x's
    group: a group of two whose amax is A, so x's code and scale are those of its
    group. Frontends quantize groups of data-dependent extent (an expert's tokens) this
    way, with their own `quantize`; `tests/test_grouped.py` checks it against the
    reference."""
    if scheme.family == "float":
        return _schemes.AxisScaling(scheme.fmt, axis=-1, pow2=scheme.pow2)  # type: ignore[union-attr]
    if scheme.family == "mx":
        return _schemes.MXScaling(scheme.fmt, block=2, mode=scheme.mode, axis=-1)  # type: ignore[union-attr]
    raise ValueError(f"no grouped quantization for {scheme}")


def check_grouped_scheme(scheme: _schemes.Scheme, kind: str) -> None:
    """ValueError unless `scheme` can scale a grouped operand of `kind`: tensorwise,
    rowwise or float8 MX (their groups stay within an expert); block and NVFP4 scaling
    are not defined for grouped operands."""
    if kind not in KINDS:
        raise ValueError(f"grouped operand kind must be one of {KINDS}, got {kind!r}")
    if not isinstance(scheme, (_schemes.TensorScaling, _schemes.AxisScaling, _schemes.MXScaling)):
        raise ValueError(  # noqa: TRY004 - a valid scheme, not one grouped operands take
            f"grouped GEMM operands take TensorScaling, AxisScaling or MXScaling, got {scheme}"
        )
    if getattr(scheme, "axis", -1) != -1:
        raise ValueError(f"grouped operands scale along their last axis, got {scheme}")
    if scheme.fmt == "float4_e2m1fn":
        raise ValueError(f"grouped operands do not take packed float4 yet, got {scheme}")


# --- the plan ---


@dataclasses.dataclass(frozen=True)
class GroupedOperand:
    """One operand of a grouped GEMM: `tensor` ("x", "w", "g", "x.T", "w.T", "g.T" as
    the GEMM reads it), its `kind` (module docstring) and the recipe's `scheme`."""

    tensor: str
    kind: str
    scheme: _schemes.Scheme

    @property
    def dims(self) -> tuple[str, ...]:
        return _DIMS[self.tensor]


@dataclasses.dataclass(frozen=True)
class GroupedGemm:
    """One quantized grouped GEMM: its name, operands a and b, fast accumulation."""

    name: str
    a: GroupedOperand
    b: GroupedOperand
    fast_accum: bool


@dataclasses.dataclass(frozen=True)
class GroupedPlan:
    """How `recipe` runs the three grouped GEMMs of an MoE layer (`GroupedPlan.of`);
    a GEMM the recipe runs in high precision is None.

    >>> plan = GroupedPlan.of(_recipes.Recipe.from_name("mxfp8"))
    >>> plan.wgrad.a.tensor, plan.wgrad.a.kind, plan.wgrad.a.scheme.block
    ('g.T', 'tokens', 32)
    """

    recipe: _recipes.Recipe
    forward: GroupedGemm
    dgrad: GroupedGemm | None
    wgrad: GroupedGemm | None

    @classmethod
    def of(cls, recipe: _recipes.Recipe) -> "GroupedPlan":
        if not isinstance(recipe, _recipes.Recipe):
            raise TypeError(f"expected a lowp.Recipe, got {recipe!r}")
        gemms: dict[str, GroupedGemm | None] = {}
        for name, ((ta, ka), (tb, kb)) in _OPERANDS.items():
            spec = getattr(recipe, name)
            if spec.high_precision:
                gemms[name] = None
                continue
            for scheme, kind in ((spec.a, ka), (spec.b, kb)):
                try:
                    check_grouped_scheme(scheme, kind)
                except ValueError as e:
                    raise ValueError(f"recipe {recipe.name!r}, {name} GEMM: {e}") from e
            gemms[name] = GroupedGemm(
                name,
                GroupedOperand(ta, ka, spec.a),
                GroupedOperand(tb, kb, spec.b),
                spec.fast_accum,
            )
        forward = gemms["forward"]
        assert forward is not None  # Recipe refuses a high-precision forward
        return cls(recipe, forward, gemms["dgrad"], gemms["wgrad"])

    def gemms(self) -> tuple[GroupedGemm, ...]:
        return tuple(g for g in (self.forward, self.dgrad, self.wgrad) if g is not None)

    def check(self, k: int, n: int, *, backward: bool = True) -> None:
        """ValueError naming the GEMM, operand and dim if a scheme cannot take a feature
        dim (an MX block must divide K for the forward, N for the dgrad). The tokens
        never fail: an expert's last MX block may be short (module docstring)."""
        sizes = {"K": k, "N": n}
        for gemm in self.gemms() if backward else (self.forward,):
            for op in (gemm.a, gemm.b):
                dim = op.dims[-1]
                if dim == "T" or not isinstance(op.scheme, _schemes.MXScaling):
                    continue
                if sizes[dim] % op.scheme.block:
                    raise ValueError(
                        f"the {self.recipe.name} {gemm.name} GEMM cannot quantize {op.tensor} "
                        f"along {dim} = {sizes[dim]} ({DIM_NAMES[dim]}): MX block "
                        f"{op.scheme.block} does not divide it; lowp never pads silently"
                    )


# --- the reference ---


@dataclasses.dataclass(frozen=True, eq=False)
class GroupedQTensor:
    """A grouped operand's bytes, as the GEMM reads it (module docstring).

    Attributes:
      codes: uint8, the operand's shape: (T, C) rows, (E, R, C) experts, (C, T) tokens.
      scale: float32 or uint8 (e8m0). Tensorwise: (E,), one per expert. Otherwise rows
        and experts: the scheme's plain scale of the whole operand ((T, 1), (T, C/32),
        (E, R, 1), (E, R, C/32)); tokens: (C, E) float, (C, capacity) MX.
      scheme, kind, group_sizes: how it was made.
      hp_dtype: the dtype it was quantized from.
    """

    codes: np.ndarray
    scale: np.ndarray
    scheme: _schemes.Scheme
    kind: str
    group_sizes: np.ndarray
    hp_dtype: str

    def groups(self) -> list[_qtensor.QTensor]:
        """Each expert's slice of the operand as the QTensor `lowp.quantize` gives for it
        (an MX short block as its zero-padded block, the padding dropped from codes only
        where the slice is a whole number of blocks)."""
        return [self._group(e) for e in range(len(self.group_sizes))]

    def _group(self, e: int) -> _qtensor.QTensor:
        start = int(self.group_sizes[:e].sum())
        size = int(self.group_sizes[e])
        tensorwise = isinstance(self.scheme, _schemes.TensorScaling)
        if self.kind == "experts":
            codes = self.codes[e]
            scale = self.scale[e]
        elif self.kind == "rows":
            codes = self.codes[start : start + size]
            scale = self.scale[e] if tensorwise else self.scale[start : start + size]
        elif tensorwise:
            codes, scale = self.codes[:, start : start + size], self.scale[e]
        elif self.scheme.family == "float":
            codes, scale = self.codes[:, start : start + size], self.scale[:, e : e + 1]
        else:  # MX along the tokens: whole blocks, a short last block padded with code 0
            assert isinstance(self.scheme, _schemes.MXScaling)
            block = self.scheme.block
            first = int(np.ceil(self.group_sizes[:e] / block).sum())
            blocks = math.ceil(size / block)
            codes = np.zeros((self.codes.shape[0], blocks * block), np.uint8)
            codes[:, :size] = self.codes[:, start : start + size]
            scale = self.scale[:, first : first + blocks]
        return _qtensor.QTensor(
            codes=np.array(codes, order="C"),
            scale=np.array(scale, order="C"),
            global_scale=None,
            scheme=self.scheme,
            shape=codes.shape,
            hp_dtype=self.hp_dtype,
        )

    def dequantize(self) -> np.ndarray:
        """The operand's values as float32, expert by expert (`lowp.dequantize`)."""
        parts = [_quantize.dequantize(q, "float32") for q in self.groups()]
        if self.kind == "experts":
            return np.stack(parts)
        if self.kind == "rows":
            return np.concatenate(parts, axis=0)
        parts = [p[:, :n] for p, n in zip(parts, self.group_sizes, strict=True)]
        return np.concatenate(parts, axis=1)


def quantize_grouped(
    t: np.ndarray, scheme: _schemes.Scheme, group_sizes, kind: str, *, name: str = "input"
) -> GroupedQTensor:
    """Quantize a grouped operand expert by expert: the reference of spec §10.

    Args:
      t: the high-precision tensor as it lies: (T, C) token-major for "rows" and
        "tokens" (the operand of "tokens" is t.T), (E, R, C) for "experts".
      scheme: TensorScaling, AxisScaling or MXScaling along the last axis.
      group_sizes: (E,) tokens of each expert, summing to T (`group_sizes_from_offs`
        converts offsets); for "experts", E = t.shape[0].
      kind: "rows", "experts" or "tokens".
    """
    check_grouped_scheme(scheme, kind)
    hp_dtype = _quantize._hp_input(t, name)[1]
    if kind == "experts":
        if t.ndim != 3:
            raise ValueError(f"{name}: expert weights are (E, R, C), got shape {t.shape}")
        sizes = np.asarray(group_sizes, np.int64)
        if sizes.shape != (t.shape[0],):
            raise ValueError(f"{name}: {t.shape[0]} experts, group sizes {sizes.tolist()}")
        qs = [_quantize.quantize(t[e], scheme, name=f"{name}[{e}]") for e in range(t.shape[0])]
        codes = np.stack([q.codes for q in qs])
        scale = np.stack([q.scale for q in qs])
        return GroupedQTensor(codes, scale, scheme, kind, sizes, hp_dtype)
    if t.ndim != 2:
        raise ValueError(f"{name}: a grouped operand of kind {kind!r} is (T, C), got {t.shape}")
    sizes = check_group_sizes(group_sizes, t.shape[0])
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    slices = [t[s : s + n] for s, n in zip(starts, sizes, strict=True)]
    if kind == "rows":
        qs = [_quantize.quantize(sl, scheme, name=name) for sl in slices]
        codes = np.concatenate([q.codes for q in qs], axis=0)
        if isinstance(scheme, _schemes.TensorScaling):
            scale = np.stack([q.scale for q in qs])
        else:
            scale = np.concatenate([q.scale for q in qs], axis=0)
        return GroupedQTensor(codes, scale, scheme, kind, sizes, hp_dtype)
    # tokens: each expert's slice transposed, (C, T_e), along its tokens
    block: int = scheme.block if isinstance(scheme, _schemes.MXScaling) else 1
    parts: list[tuple[np.ndarray, np.ndarray]] = []
    for sl in slices:
        op = np.ascontiguousarray(sl.T)
        pad = -op.shape[1] % block  # an MX short block: its own elements' scale
        if pad:
            op = np.concatenate([op, np.zeros((op.shape[0], pad), op.dtype)], axis=1)
        q = _quantize.quantize(op, scheme, name=name)
        parts.append((q.codes[:, : sl.shape[0]], q.scale))
    codes = np.concatenate([c for c, _ in parts], axis=1)
    if isinstance(scheme, _schemes.TensorScaling):
        scale = np.stack([s for _, s in parts])
    elif scheme.family == "float":
        scale = np.concatenate([s for _, s in parts], axis=1).reshape(t.shape[1], len(sizes))
    else:
        used = np.concatenate([s for _, s in parts], axis=1).reshape(t.shape[1], -1)
        free = token_capacity(t.shape[0], len(sizes), block) - used.shape[1]
        empty = _quantize.quantize(np.zeros((t.shape[1], free * block), np.float32), scheme)
        scale = np.concatenate([used, empty.scale], axis=1)
    return GroupedQTensor(codes, scale, scheme, kind, sizes, hp_dtype)


def token_segments(group_sizes: np.ndarray, block: int | None) -> np.ndarray:
    """Each token's segment, the run of rows one scale covers along the tokens: its
    expert (block None) or its MX block's slot (expert e's blocks start at slot
    sum_{j<e} ceil(T_j / block)). What a frontend's segment max reduces over."""
    sizes = np.asarray(group_sizes, np.int64)
    expert = np.repeat(np.arange(len(sizes)), sizes)
    if block is None:
        return expert
    starts = np.cumsum(sizes) - sizes
    first_slot = np.cumsum(-(-sizes // block)) - (-(-sizes // block))
    within = np.arange(int(sizes.sum())) - starts[expert]
    return first_slot[expert] + within // block
