"""Grouped operands of MoE GEMMs (spec §10): every operand of the forward, dgrad and wgrad
grouped GEMMs of a recipe, on every backend, against `lowp.extend.quantize_grouped`.

A case is one routing (an edge case of spec §10) under one recipe: x (T, K), w (E, N, K)
and g (T, N) in bfloat16, and the group sizes. Each backend returns its operands as
(codes, scale) byte arrays through its `grouped_operands` (lowp_torch.grouped_operands,
lowp_jax's `_ragged_dot.grouped_operands`), and they must equal the reference's.
"""

import dataclasses

import ml_dtypes
import numpy as np

import lowp
from lowp import extend

RECIPES = ("float8_rowwise", "float8_tensorwise", "mxfp8")
K, N = 64, 96


@dataclasses.dataclass(frozen=True)
class GroupedCase:
    """One routing: `sizes` tokens per expert; `poison` (row, col, value) written into x."""

    name: str
    sizes: tuple[int, ...]
    poison: tuple[int, int, float] | None = None


# empty experts, one token, all tokens in one expert, sizes off multiples of 16/32/128,
# NaN/Inf in one expert's tokens (poisoning only that expert's groups)
CASES = (
    GroupedCase("balanced", (32, 32, 32, 32)),
    GroupedCase("empty_experts", (0, 40, 0, 24, 0)),
    GroupedCase("one_token", (0, 1, 0)),
    GroupedCase("one_expert", (0, 0, 77, 0)),
    GroupedCase("odd_sizes", (17, 129, 31, 3, 33)),
    GroupedCase("nan_one_expert", (20, 45, 12), (30, 5, float("nan"))),
    GroupedCase("inf_one_expert", (20, 45, 12), (66, 0, float("-inf"))),
)


def cases(size: str = "full") -> list[tuple[GroupedCase, str]]:
    """(case, recipe) pairs of the plan; "thin" keeps two routings."""
    chosen = CASES if size != "thin" else CASES[1:3]
    return [(case, recipe) for case in chosen for recipe in RECIPES]


def inputs(case: GroupedCase) -> dict[str, np.ndarray]:
    """x, w, g in bfloat16 for the case (seeded by its name)."""
    rng = np.random.default_rng(sum(map(ord, case.name)))
    t, e = sum(case.sizes), len(case.sizes)
    x = (rng.standard_normal((t, K)) * 4).astype(np.float32)
    if case.poison is not None:
        row, col, value = case.poison
        x[row, col] = value
    w = (rng.standard_normal((e, N, K)) * 0.05).astype(np.float32)
    g = (rng.standard_normal((t, N)) * 1e-3).astype(np.float32)
    return {k: v.astype(ml_dtypes.bfloat16) for k, v in {"x": x, "w": w, "g": g}.items()}


def reference(arrays: dict, sizes, recipe: str) -> dict:
    """{gemm: ((codes, scale bytes) of a, of b)} by `extend.quantize_grouped`."""
    plan = extend.GroupedPlan.of(lowp.Recipe.from_name(recipe))
    x, w, g = arrays["x"], arrays["w"], arrays["g"]
    tensors = {"x": x, "w": w, "g": g, "w.T": w.transpose(0, 2, 1), "g.T": g, "x.T": x}
    out: dict = {}
    for gemm in plan.gemms():
        out[gemm.name] = tuple(
            _as_bytes(
                extend.quantize_grouped(
                    np.ascontiguousarray(tensors[op.tensor]), op.scheme, sizes, op.kind
                )
            )
            for op in (gemm.a, gemm.b)
        )
    return out


def _as_bytes(q) -> tuple[np.ndarray, np.ndarray]:
    return q.codes, np.ascontiguousarray(q.scale).view(np.uint8)


def check(backend, case: GroupedCase, recipe: str) -> list[str]:
    """How `backend`'s grouped operands differ from the reference ([]: identical)."""
    arrays = inputs(case)
    want = reference(arrays, np.array(case.sizes), recipe)
    got = backend.grouped_operands(arrays, np.array(case.sizes, np.int32), recipe)
    problems = []
    for gemm, operands in want.items():
        for side, (w_ops, g_ops) in zip("ab", zip(operands, got[gemm], strict=True), strict=True):
            for what, want_bytes, got_bytes in zip(("codes", "scale"), w_ops, g_ops, strict=True):
                got_bytes = np.ascontiguousarray(got_bytes).view(np.uint8)
                if got_bytes.shape != want_bytes.shape:
                    problems.append(
                        f"{gemm} {side} {what}: shape {got_bytes.shape}, want {want_bytes.shape}"
                    )
                elif not np.array_equal(got_bytes, want_bytes):
                    first = tuple(int(i) for i in np.argwhere(got_bytes != want_bytes)[0])
                    problems.append(
                        f"{gemm} {side} {what}: {int((got_bytes != want_bytes).sum())} bytes "
                        f"differ, the first at {first}: {got_bytes[first]:#04x}, want "
                        f"{want_bytes[first]:#04x}"
                    )
    return problems
