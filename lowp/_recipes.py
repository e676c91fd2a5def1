"""Training recipes and inference presets (spec §8), defined once for both frontends.

Orientation: every GEMM is written `y = a @ b.T` with both operands stored with the
reduction axis last (the layout cuBLAS's fp8 GEMMs read: row-major A, column-major B).
For `y = x @ w.T` with x: (M, K), w: (N, K), g = dL/dy: (M, N):

  forward  y  = x  @ w.T      a = x   (M, K)   b = w    (N, K)   reduce over K
  dgrad    dx = g  @ w        a = g   (M, N)   b = w.T  (K, N)   reduce over N
  wgrad    dw = g.T @ x       a = g.T (N, M)   b = x.T  (K, M)   reduce over M

so every operand scheme below scales along axis -1 of the operand as the GEMM reads
it, and the frontend builds `a` and `b` by transposing the high-precision tensor
(never another orientation's codes) before quantizing. The one exception is
tensorwise scaling, whose single scale does not care about orientation: a frontend
may transpose those codes instead of re-quantizing. Which operand each GEMM reads, in
which orientation, and which codes it reuses is `lowp.extend.LinearPlan`'s answer
(`lowp/_linear_plan.py`), which both frontends execute.
"""

import dataclasses

from lowp import _rounding, _schemes

_E4M3 = "float8_e4m3fn"
_E5M2 = "float8_e5m2"


@dataclasses.dataclass(frozen=True)
class GemmSpec:
    """How one GEMM `a @ b.T` of a recipe runs.

    Attributes:
      a, b: the scheme each operand is quantized with (reduction axis last), or both
        None: this GEMM runs in high precision.
      fast_accum: allow the GEMM's fast (reduced-precision) fp8 accumulation.
      a_rounding, b_rounding: "nearest" or "stochastic" (spec §4) for each operand's
        elements; stochastic bits come from the recipe's seed and the operand's data
        (spec §8, "NVFP4 training").
      hadamard: multiply both operands along the reduction axis by the random Hadamard
        transform (`lowp._hadamard`, 16-element blocks) before quantizing them: the
        product is unchanged (the transform is orthonormal), outliers are spread.
    """

    a: _schemes.Scheme | None
    b: _schemes.Scheme | None
    fast_accum: bool = False
    a_rounding: str = "nearest"
    b_rounding: str = "nearest"
    hadamard: bool = False

    def __post_init__(self):
        if (self.a is None) != (self.b is None):
            raise ValueError(
                f"GemmSpec: quantize both operands or neither, got a={self.a}, b={self.b}"
            )
        for operand in (self.a, self.b):
            if operand is not None:
                _schemes.check_scheme(operand)
                if getattr(operand, "axis", -1) != -1:
                    raise ValueError(
                        f"GemmSpec operands scale along their reduction axis, stored last: "
                        f"axis must be -1, got {operand}"
                    )
        if not isinstance(self.fast_accum, bool):
            raise TypeError(f"GemmSpec.fast_accum must be a bool, got {self.fast_accum!r}")
        if self.a is None and self.fast_accum:
            raise ValueError("GemmSpec: fast_accum applies to quantized GEMMs only")
        for field in ("a_rounding", "b_rounding"):
            rounding = getattr(self, field)
            if rounding not in _rounding.ROUNDINGS:
                raise ValueError(
                    f"GemmSpec.{field} must be one of {_rounding.ROUNDINGS}, got {rounding!r}"
                )
            if self.a is None and rounding != "nearest":
                raise ValueError(f"GemmSpec: {field} applies to quantized GEMMs only")
        if not isinstance(self.hadamard, bool):
            raise TypeError(f"GemmSpec.hadamard must be a bool, got {self.hadamard!r}")
        if self.a is None and self.hadamard:
            raise ValueError("GemmSpec: hadamard applies to quantized GEMMs only")

    @property
    def high_precision(self) -> bool:
        """Whether this GEMM runs unquantized (`a` and `b` are None)."""
        return self.a is None


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A low-precision training recipe: the three GEMMs of a linear layer.

    Attributes:
      name: the recipe's name in spec §8.
      forward, dgrad, wgrad: the GemmSpec of y = x w^T, dx = g w, dw = g^T x.
      fp32_weight_grad_accumulation: accumulate weight gradients in float32 across
        micro-batches (the frontends keep the float32 buffer).
      seed: of the Hadamard transform's signs and of stochastic rounding's bits (spec §8).

    >>> Recipe.from_name("float8_rowwise").dgrad.a
    AxisScaling(fmt='float8_e4m3fn', axis=-1, pow2=True)
    """

    name: str
    forward: GemmSpec
    dgrad: GemmSpec
    wgrad: GemmSpec
    fp32_weight_grad_accumulation: bool = False
    seed: int = 0

    def __post_init__(self):
        for field in ("forward", "dgrad", "wgrad"):
            if not isinstance(getattr(self, field), GemmSpec):
                raise TypeError(f"Recipe.{field} must be a GemmSpec, got {getattr(self, field)!r}")
        if self.forward.high_precision:
            raise ValueError(f"Recipe {self.name!r}: the forward GEMM must be quantized")
        if not isinstance(self.fp32_weight_grad_accumulation, bool):
            raise TypeError("Recipe.fp32_weight_grad_accumulation must be a bool")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise TypeError(f"Recipe.seed must be an int, got {self.seed!r}")

    @property
    def block_scaled(self) -> bool:
        """Whether a quantized GEMM takes block-scaled operands (MX, NVFP4), whose GEMM
        kernels need a newer GPU than float8's (NVIDIA compute capability 10.0)."""
        return any(
            scheme is not None and scheme.family in ("mx", "nvfp4")
            for spec in (self.forward, self.dgrad, self.wgrad)
            for scheme in (spec.a, spec.b)
        )

    @staticmethod
    def names() -> tuple[str, ...]:
        """The training recipes' names `from_name` takes, in the order the docs list them
        (the ablation variants, `ablation_names`, apart)."""
        return tuple(_RECIPES)

    @staticmethod
    def ablation_names() -> tuple[str, ...]:
        """The ablation variants' names `from_name` also takes: `nvfp4` without its random
        Hadamard transform (`nvfp4_no_rht`), without stochastic rounding (`nvfp4_no_sr`)
        or without both (`nvfp4_plain`), to measure what each part buys (spec §8). They
        are not recipes to train with, so `names()` and the sweeps over it leave them out.
        """
        return tuple(_ABLATIONS)

    @classmethod
    def from_name(cls, name: str) -> "Recipe":
        """The recipe called `name` (spec §8); ValueError naming it if unknown."""
        known = isinstance(name, str)  # str first: a list or dict is unhashable for `in`
        if known and name in _RECIPES:
            return _RECIPES[name]()
        if known and name in _ABLATIONS:
            return _ABLATIONS[name]()
        hint = ""
        if known and name in _TORCHAO_RECIPE_NAMES:
            hint = f" ({name!r} is torchao's name for {_TORCHAO_RECIPE_NAMES[name]!r})"
        raise ValueError(
            f"unknown recipe {name!r}{hint}; expected one of {cls.names()} "
            f"or an ablation variant {cls.ablation_names()}"
        )

    @classmethod
    def of(cls, recipe: "Recipe | str") -> "Recipe":
        """`recipe` itself, or the recipe it names; TypeError naming anything else."""
        if isinstance(recipe, str):
            return cls.from_name(recipe)
        if not isinstance(recipe, cls):
            raise TypeError(
                f"expected a lowp.Recipe or a recipe name {cls.names()}, got {recipe!r}"
            )
        return recipe


def _float8_tensorwise() -> Recipe:
    x_w = _schemes.TensorScaling(_E4M3)
    grad = _schemes.TensorScaling(_E5M2)
    return Recipe(
        name="float8_tensorwise",
        forward=GemmSpec(x_w, x_w, fast_accum=True),
        dgrad=GemmSpec(grad, x_w),
        wgrad=GemmSpec(grad, x_w),
    )


def _float8_rowwise() -> Recipe:
    rowwise = _schemes.AxisScaling(_E4M3, axis=-1, pow2=True)
    return Recipe(
        name="float8_rowwise",
        forward=GemmSpec(rowwise, rowwise, fast_accum=True),
        dgrad=GemmSpec(rowwise, rowwise),
        wgrad=GemmSpec(rowwise, rowwise),
    )


def _float8_rowwise_gw_hp() -> Recipe:
    rowwise = _schemes.AxisScaling(_E4M3, axis=-1, pow2=True)
    return Recipe(
        name="float8_rowwise_gw_hp",
        forward=GemmSpec(rowwise, rowwise, fast_accum=True),
        dgrad=GemmSpec(rowwise, _schemes.TensorScaling(_E4M3, pow2=True)),
        wgrad=GemmSpec(None, None),
    )


def _mxfp8() -> Recipe:
    mx = _schemes.MXScaling(_E4M3, block=32, mode="rceil", axis=-1)
    return Recipe(
        name="mxfp8",
        forward=GemmSpec(mx, mx, fast_accum=True),
        dgrad=GemmSpec(mx, mx),
        wgrad=GemmSpec(mx, mx),
    )


def _mxfp8_gw_hp() -> Recipe:
    mx = _schemes.MXScaling(_E4M3, block=32, mode="rceil", axis=-1)
    return Recipe(
        name="mxfp8_gw_hp",
        forward=GemmSpec(mx, mx, fast_accum=True),
        dgrad=GemmSpec(mx, mx),
        wgrad=GemmSpec(None, None),
    )


def _float8_blockwise(pow2: bool) -> Recipe:
    # DeepSeek-V3: activations and gradients per 1x128 along the GEMM's reduction axis,
    # weights per 128x128 block, e4m3 everywhere. A transposed operand's 1x128 runs
    # along its tensor's first axis (the plan's `along_first_axis`: 128x1 tiles there).
    act = _schemes.BlockScaling(_E4M3, block=(1, 128), pow2=pow2)
    weight = _schemes.BlockScaling(_E4M3, block=(128, 128), pow2=pow2)
    return Recipe(
        name="float8_blockwise_ue8m0" if pow2 else "float8_blockwise",
        forward=GemmSpec(act, weight),
        dgrad=GemmSpec(act, weight),
        wgrad=GemmSpec(act, act),
    )


def _nvfp4(name: str = "nvfp4", *, hadamard: bool = True, stochastic: bool = True) -> Recipe:
    # Transformer Engine's NVFP4BlockScaling: 1x16 e4m3 block scales and a float32
    # global scale for activations and gradients, 16x16 tiles for weights (w and w.T
    # hold the same values), stochastic rounding of the gradient, and the random
    # Hadamard transform on both wgrad operands (along the tokens M). The ablation
    # variants turn the transform or the stochastic rounding off and change nothing else.
    act = _schemes.NVFP4Scaling(block=16, global_scale=True)
    weight = _schemes.NVFP4TileScaling(tile=(16, 16), global_scale=True)
    grad_rounding = "stochastic" if stochastic else "nearest"
    return Recipe(
        name=name,
        forward=GemmSpec(act, weight),
        dgrad=GemmSpec(act, weight, a_rounding=grad_rounding),
        wgrad=GemmSpec(act, act, a_rounding=grad_rounding, hadamard=hadamard),
    )


_RECIPES = {
    "float8_tensorwise": _float8_tensorwise,
    "float8_rowwise": _float8_rowwise,
    "float8_rowwise_gw_hp": _float8_rowwise_gw_hp,
    "mxfp8": _mxfp8,
    "mxfp8_gw_hp": _mxfp8_gw_hp,
    "float8_blockwise": lambda: _float8_blockwise(pow2=False),
    "float8_blockwise_ue8m0": lambda: _float8_blockwise(pow2=True),
    "nvfp4": _nvfp4,
}
# Ablations of nvfp4 (`Recipe.ablation_names`): each takes one part of the recipe away.
_ABLATIONS = {
    "nvfp4_no_rht": lambda: _nvfp4("nvfp4_no_rht", hadamard=False),
    "nvfp4_no_sr": lambda: _nvfp4("nvfp4_no_sr", stochastic=False),
    "nvfp4_plain": lambda: _nvfp4("nvfp4_plain", hadamard=False, stochastic=False),
}
_TORCHAO_RECIPE_NAMES = {
    "tensorwise": "float8_tensorwise",
    "rowwise": "float8_rowwise",
    "rowwise_with_gw_hp": "float8_rowwise_gw_hp",
}


@dataclasses.dataclass(frozen=True)
class InferenceConfig:
    """How `quantize_` / `quantize_params` quantize a linear layer for inference.

    Attributes:
      weight: scheme for the weight, stored (out_features, in_features) and scaled
        along in_features (axis -1) where the scheme has an axis.
      activation: scheme for the activation, quantized dynamically at each call, or
        None for weight-only quantization (the matmul runs in high precision).

    >>> InferenceConfig.from_name("mxfp4").weight
    MXScaling(fmt='float4_e2m1fn', block=32, mode='rceil', axis=-1)
    """

    weight: _schemes.Scheme
    activation: _schemes.Scheme | None = None

    def __post_init__(self):
        _schemes.check_scheme(self.weight)
        if self.activation is not None:
            _schemes.check_scheme(self.activation)
        for field, scheme in (("weight", self.weight), ("activation", self.activation)):
            # Along in_features, stored last: another axis would scale an activation
            # across tokens (its output then depending on the batch).
            if getattr(scheme, "axis", -1) != -1:
                raise ValueError(
                    f"InferenceConfig.{field} scales along in_features, axis -1; got {scheme}"
                )

    @staticmethod
    def names() -> tuple[str, ...]:
        """The preset names `from_name` takes (and `quantize_` / `quantize_params` take
        as a string), in the order the docs list them."""
        return tuple(_PRESETS)

    @classmethod
    def from_name(cls, name: str) -> "InferenceConfig":
        """The preset called `name` (spec §8); ValueError naming it if unknown."""
        if not isinstance(name, str) or name not in _PRESETS:  # str first: a list is unhashable
            raise ValueError(f"unknown inference preset {name!r}; expected one of {cls.names()}")
        weight, activation = _PRESETS[name]
        return cls(weight=weight, activation=activation)


_PRESETS: dict[str, tuple[_schemes.Scheme, _schemes.Scheme | None]] = {
    "float8_tensorwise": (_schemes.TensorScaling(_E4M3), _schemes.TensorScaling(_E4M3)),
    "float8_rowwise": (_schemes.AxisScaling(_E4M3, axis=-1), _schemes.AxisScaling(_E4M3, axis=-1)),
    "float8_weight_only": (_schemes.AxisScaling(_E4M3, axis=-1), None),
    "float8_block": (
        _schemes.BlockScaling(_E4M3, block=(128, 128)),
        _schemes.BlockScaling(_E4M3, block=(1, 128)),
    ),
    "mxfp8": (_schemes.MXScaling(_E4M3, mode="rceil"), _schemes.MXScaling(_E4M3, mode="rceil")),
    "mxfp4": (
        _schemes.MXScaling("float4_e2m1fn", mode="rceil"),
        _schemes.MXScaling("float4_e2m1fn", mode="rceil"),
    ),
    "nvfp4": (_schemes.NVFP4Scaling(global_scale=True), _schemes.NVFP4Scaling(global_scale=True)),
}
