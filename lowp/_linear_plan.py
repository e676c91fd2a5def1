"""How a recipe runs a linear layer: which operand each GEMM reads, in which orientation,
with which scheme, and what the forward keeps for the backward. Computed here once;
each frontend executes it.

For `y = x @ w.T` with x: (M, K), w: (N, K) and g = dL/dy: (M, N), every GEMM is
`a @ b.T` with both operands quantized along their last axis, the GEMM's reduction
axis (spec §8):

    forward  y  = x   @ w.T     a = x   (M, K)   b = w   (N, K)   reduce over K
    dgrad    dx = g   @ w       a = g   (M, N)   b = w.T (K, N)   reduce over N
    wgrad    dw = g.T @ x       a = g.T (N, M)   b = x.T (K, M)   reduce over M

Each tensor is read twice: as it lies by one GEMM, transposed by a later one (x by the
forward, then the wgrad; w by the forward, then the dgrad; g by the dgrad, then the
wgrad). The transposed operand is quantized from the high-precision tensor, never from
the other orientation's codes, except under tensorwise scaling with the very scheme the
tensor was quantized with before (and likewise square blocks, 128x128 weight tiles):
one scale does not care about orientation and codes are elementwise, so those codes,
transposed, are the bytes quantizing the transpose gives (`OperandPlan.reuses_codes`). Then the earlier GEMM keeps its codes for the later
one instead of the high-precision tensor (`LinearPlan.keeps_codes`).

How a frontend quantizes a transposed operand is its own business, as long as the bytes
are those of quantizing a transposed copy: in place along the tensor's first axis
(`OperandPlan.along_first_axis`), both orientations from one read where the two schemes
are the same (`OperandPlan.shares_scheme`), or a kernel that writes the codes
transposed.

>>> plan = LinearPlan.of(Recipe.from_name("float8_tensorwise"))
>>> plan.wgrad.b.name, plan.wgrad.b.reuses_codes, plan.keeps_codes("x")
('x.T', True, True)
>>> plan = LinearPlan.of(Recipe.from_name("mxfp8_gw_hp"))
>>> plan.wgrad is None, plan.dgrad.b.along_first_axis
(True, MXScaling(fmt='float8_e4m3fn', block=32, mode='rceil', axis=-2))
"""

import dataclasses
import zlib
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import numpy as np

from lowp import _hadamard, _schemes
from lowp._recipes import GemmSpec, Recipe

DIM_NAMES = {"M": "tokens", "K": "in_features", "N": "out_features"}
TENSOR_DIMS = {"x": ("M", "K"), "w": ("N", "K"), "g": ("M", "N")}
# The operands (a, b) of each GEMM `a @ b.T`: a tensor, and whether the GEMM reads it
# transposed. In this order each tensor is read as it lies before it is read transposed.
_OPERANDS = {
    "forward": (("x", False), ("w", False)),
    "dgrad": (("g", False), ("w", True)),
    "wgrad": (("g", True), ("x", True)),
}


def along_first_axis(scheme: _schemes.Scheme) -> _schemes.Scheme | None:
    """The scheme that groups a 2-D t, along its first axis, as `scheme` groups t.T along
    its last: quantizing t with it and viewing the result transposed gives the bytes of
    quantizing a transposed copy with `scheme` (`Scaling.permuted`). None for packed fp4,
    whose codes pair up along the last axis: quantize the copy."""
    return scheme.permuted((1, 0))


_T = TypeVar("_T")


class _made_with_plan(Generic[_T]):
    """A property of a frozen plan computed once, when the plan is made (`_make_all`
    in `__post_init__`), and then read from the instance. Not computed on first use as
    `functools.cached_property` is: a plan first read inside a torch.compile'd
    autograd.Function would write to an object outside the traced function, which
    Dynamo refuses, and Python 3.11's cached_property takes a lock Dynamo cannot enter."""

    def __init__(self, fn: Callable[[Any], _T]) -> None:
        self.fn, self.name, self.__doc__ = fn, fn.__name__, fn.__doc__

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, owner=None) -> _T:
        if obj is None:
            return self  # type: ignore[return-value]  # the class's own attribute
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


def _make_all(plan) -> None:
    """Compute each `_made_with_plan` property of `plan` now."""
    for name, attr in vars(type(plan)).items():
        if isinstance(attr, _made_with_plan):
            getattr(plan, name)


@dataclasses.dataclass(frozen=True)
class OperandPlan:
    """One quantized operand of a GEMM `a @ b.T`.

    Attributes:
      tensor: "x", "w" or "g", the layer's tensor the operand is made of.
      transposed: whether the GEMM reads the tensor transposed.
      scheme: the recipe's scheme, along the operand's last axis as the GEMM reads it.
      earlier: for a transposed operand, the scheme an earlier GEMM quantized the same
        tensor with, as it lies, plainly (`plain`: nearest rounding, no transform); None
        where no earlier GEMM quantizes it so. Stochastically rounded or transformed
        codes are not that scheme's bytes of the tensor, so no later operand may reuse
        them or be made beside them from one read (`reuses_codes`, `shares_scheme`).
      rounding: "nearest" or "stochastic", the recipe's for this operand.
      hadamard: whether the operand is multiplied by the random Hadamard transform
        along its last axis before it is quantized (`transformed`).
      recipe_seed: the recipe's seed; role: "forward.a", ..., "wgrad.b", this operand's
        place, which its stochastic-rounding seed is made of (`rounding_seed`).
    """

    tensor: str
    transposed: bool
    scheme: _schemes.Scheme
    earlier: _schemes.Scheme | None = None
    rounding: str = "nearest"
    hadamard: bool = False
    recipe_seed: int = 0
    role: str = ""

    def __post_init__(self):
        _make_all(self)

    @_made_with_plan
    def plain(self) -> bool:
        """Whether the operand is `quantize(t, scheme)` of its orientation of the tensor
        and nothing more: nearest rounding, no transform. Only then may a frontend take
        its shortcuts (codes along the first axis, codes reused or made from one read)."""
        return self.rounding == "nearest" and not self.hadamard

    @_made_with_plan
    def rounding_seed(self) -> int:
        """The seed of the operand's stochastic-rounding bits (spec §8):
        `(recipe seed + crc32(role)) mod 2**32`; the offset is the operand's data
        (`data_offset`)."""
        return (self.recipe_seed + zlib.crc32(self.role.encode())) & 0xFFFFFFFF

    def signs(self, length: int) -> np.ndarray:
        """The Hadamard transform's sign vector for a reduction of `length` (spec §8):
        the same for both operands of the GEMM, so that the product is unchanged, and
        for every layer (layer ""): no framework's layer name enters the bytes (spec §8
        says why)."""
        return _hadamard.signs(self.recipe_seed, "", (length,))

    def quantize_reference(self, t: np.ndarray):
        """The NumPy reference of this operand: `t` (the tensor as the GEMM reads it)
        transformed where `hadamard`, then `lowp.quantize`d with the operand's rounding."""
        from lowp import _bits, _quantize

        if self.hadamard:
            t = _hadamard.transform_numpy(
                _bits.ftz(np.asarray(t, np.float32)), self.signs(t.shape[-1])
            )
        if self.rounding == "nearest":
            return _quantize.quantize(np.ascontiguousarray(t), self.scheme)
        offset = data_offset(_bits.bits(_bits.ftz(np.asarray(t, np.float32))))
        return _quantize.quantize(
            np.ascontiguousarray(t),
            self.scheme,
            rounding="stochastic",
            seed=self.rounding_seed,
            offset=offset,
        )

    @property
    def name(self) -> str:
        """The operand for messages: "x", "w", "g", or "w.T", "g.T", "x.T" read transposed."""
        return self.tensor + (".T" if self.transposed else "")

    @_made_with_plan
    def dims(self) -> tuple[str, str]:
        """The operand's dims as the GEMM reads it, among "M", "K", "N"."""
        dims = TENSOR_DIMS[self.tensor]
        return dims[::-1] if self.transposed else dims

    @_made_with_plan
    def reuses_codes(self) -> bool:
        """Whether the operand is the earlier codes of its tensor, transposed, instead of a
        quantization of its own: only where it takes the very scheme the tensor was
        quantized with and that scheme groups t.T as it groups t (`Scaling.permuted`
        gives it back): tensorwise scaling, whose one scale does not care about
        orientation, and square blocks (blockwise float8's 128x128 weight tiles), whose
        tile (i, j) of t is tile (j, i) of t.T. Codes are elementwise, so those codes,
        transposed, are the bytes quantizing the transpose gives."""
        return (
            self.plain
            and self.scheme == self.earlier
            and self.scheme.permuted((1, 0)) == self.scheme
        )

    @_made_with_plan
    def along_first_axis(self) -> _schemes.Scheme | None:
        """For a transposed operand, the scheme that quantizes its tensor where it lies,
        along the first axis (`along_first_axis`); None for packed fp4 or an operand read
        as it lies."""
        return along_first_axis(self.scheme) if self.transposed and self.plain else None

    @_made_with_plan
    def shares_scheme(self) -> bool:
        """Whether the tensor's earlier GEMM takes this very scheme and the operand needs
        its own codes along the tensor's first axis (not reused, not packed fp4): a
        frontend may then quantize the tensor both ways from one read, and keep the codes
        along its first axis for this GEMM instead of the tensor."""
        return (
            self.plain
            and self.scheme == self.earlier
            and not self.reuses_codes
            and self.along_first_axis is not None
        )


def data_offset(bits: np.ndarray) -> int:
    """The offset of an operand's stochastic-rounding bits (spec §8): the sum of its
    float32 bit patterns (flushed, as quantized) mod 2**32, an integer sum, so every
    backend gets it in any order. It changes with the data, so each step draws other bits
    with no state to carry, and replicas given the same data draw the same."""
    return int(np.sum(bits, dtype=np.uint64) & np.uint64(0xFFFFFFFF))


@dataclasses.dataclass(frozen=True)
class GemmPlan:
    """One quantized GEMM `a @ b.T` of a linear layer.

    Attributes:
      name: "forward", "dgrad" or "wgrad".
      a, b: its operands.
      fast_accum: the recipe allows the GEMM's fast (reduced-precision) fp8 accumulation.
    """

    name: str
    a: OperandPlan
    b: OperandPlan
    fast_accum: bool

    @property
    def dims(self) -> tuple[str, str, str]:
        """The GEMM's own (rows, reduction, columns) as the layer's dims: ("M", "K", "N")
        for the forward, ("M", "N", "K") for the dgrad, ("N", "M", "K") for the wgrad."""
        return self.a.dims + self.b.dims[:1]


@dataclasses.dataclass(frozen=True)
class LinearPlan:
    """How `recipe` runs the three GEMMs of a linear layer (`LinearPlan.of`).

    Attributes:
      recipe: the recipe.
      forward, dgrad, wgrad: each GEMM's plan; None for one the recipe runs in high
        precision (the forward never is).
    """

    recipe: Recipe
    forward: GemmPlan
    dgrad: GemmPlan | None
    wgrad: GemmPlan | None

    def __post_init__(self):
        _make_all(self)

    @classmethod
    def of(cls, recipe: Recipe) -> "LinearPlan":
        """The plan of `recipe`; TypeError for anything that is not a Recipe."""
        if not isinstance(recipe, Recipe):
            raise TypeError(f"expected a lowp.Recipe, got {recipe!r}")
        # tensor -> the scheme a GEMM quantized it with, as it lies, plainly (None: not plainly)
        earlier: dict[str, _schemes.Scheme | None] = {}
        gemms: dict[str, GemmPlan | None] = {}
        for name, operands in _OPERANDS.items():
            spec: GemmSpec = getattr(recipe, name)
            if spec.a is None or spec.b is None:  # high precision
                gemms[name] = None
                continue
            a, b = (
                OperandPlan(
                    tensor,
                    transposed,
                    scheme,
                    earlier.get(tensor) if transposed else None,
                    rounding,
                    spec.hadamard,
                    recipe.seed,
                    f"{name}.{side}",
                )
                for (tensor, transposed), scheme, rounding, side in zip(
                    operands,
                    (spec.a, spec.b),
                    (spec.a_rounding, spec.b_rounding),
                    "ab",
                    strict=True,
                )
            )
            for operand in (a, b):
                if not operand.transposed:
                    earlier[operand.tensor] = operand.scheme if operand.plain else None
            gemms[name] = GemmPlan(name, a, b, spec.fast_accum)
        forward = gemms["forward"]
        assert forward is not None  # Recipe refuses a high-precision forward
        return cls(recipe, forward, gemms["dgrad"], gemms["wgrad"])

    def transposed_operand(self, tensor: str) -> OperandPlan | None:
        """The operand that reads `tensor` ("x", "w" or "g") transposed: the wgrad's x.T,
        the dgrad's w.T, the wgrad's g.T; None where that GEMM runs in high precision."""
        if tensor not in TENSOR_DIMS:
            raise ValueError(f"a linear layer's tensors are {tuple(TENSOR_DIMS)}, got {tensor!r}")
        return self._transposed_operands.get(tensor)

    @_made_with_plan
    def _transposed_operands(self) -> "dict[str, OperandPlan]":
        """{tensor: the operand reading it transposed}, made once: a training layer asks
        at every call."""
        found: dict[str, OperandPlan] = {}
        for gemm in (self.dgrad, self.wgrad):
            for op in () if gemm is None else (gemm.a, gemm.b):
                if op.transposed:
                    found.setdefault(op.tensor, op)
        return found

    def keeps_codes(self, tensor: str) -> bool:
        """Whether the GEMM that quantizes `tensor` as it lies (the forward for x and w,
        the dgrad for g) keeps those codes for the GEMM that reads it transposed, instead
        of the high-precision tensor (`OperandPlan.reuses_codes`)."""
        later = self.transposed_operand(tensor)
        return later is not None and later.reuses_codes

    def check(self, m: int | None, k: int, n: int, *, backward: bool = True) -> None:
        """ValueError if a quantized GEMM's scheme cannot take its operand, for x (m, k),
        w (n, k) and g (m, n), naming the GEMM, the operand, the dim and the scheme's own
        reason (an MX block must divide K for the forward, N for the dgrad, M for the
        wgrad).

        Args:
          m: the tokens, or None where they are not known yet (a layer checked when it is
            built): then M is taken as 0, which every scheme takes, and only K and N are
            checked.
          backward: False checks the forward GEMM alone (a call that is not
            differentiated).
        """
        sizes = {"M": 0 if m is None else m, "K": k, "N": n}
        gemms = (self.forward, self.dgrad, self.wgrad) if backward else (self.forward,)
        for gemm in gemms:
            if gemm is None:
                continue
            for op in (gemm.a, gemm.b):
                shape = tuple(sizes[d] for d in op.dims)
                try:
                    op.scheme.check_shape(shape)
                except ValueError as e:
                    dim = op.dims[-1]
                    raise ValueError(
                        f"the {self.recipe.name} {gemm.name} GEMM cannot quantize {op.name} of "
                        f"shape {shape} along {dim} = {shape[-1]} ({DIM_NAMES[dim]}): {e}"
                    ) from e
