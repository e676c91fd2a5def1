"""Where an fp8 training call cannot pay for its casts: the small-shape policy.

A training layer's three fp8 GEMMs save time in proportion to their work, 6·M·K·N flops,
while quantizing x, w and dy costs memory traffic in proportion to their sizes and host
time (launches, Python) that does not shrink with them. The policy predicts both calls'
times from what they must do, at rates measured on the device, and runs a call in high
precision where fp8 would be the slower:

    device_ms(fp8)  = (M·K + K·N + M·N) · cast_bytes / bandwidth + 6·M·K·N / fp8_rate
    device_ms(bf16) = 6·M·K·N / bf16_rate
    call_ms         = max(host, device) + overlap · min(host, device)

host is a call's host time (the fastest call of a shape sweep, where the device's work
is shorter than its launches); `overlap` says how much of the shorter of host and device
time still shows in a step, since the two overlap only in part. fp8 runs where its
predicted time is under `MARGIN` times high precision's.

A traced call — one that becomes part of a compiled graph (`torch.compile`, `jax.jit`) —
has no host time of its own: the graph's code replaces the call's Python, and what is
left of it (its kernels' launches) runs ahead of the device's queue. Its prediction is
the device time alone: call_ms = device_ms. (The host times above are those of eager
calls; applied to a compiled step they kept Llama-3-8B's attention projections at 8192
tokens in bf16, where their device times say fp8 is 1.1-1.5x faster.) The constants per recipe
(`COSTS`) were measured on one H200 by `bench/small_shape_costs.py` (the run and its
fit: docs/performance.md, "Small shapes"); other GPUs with fp8 GEMMs use them too, and
so do the recipes not measured there (float8_blockwise, and the MX and NVFP4 recipes
where sm_100 runs their GEMMs), which take float8_rowwise's: guesses this module says
rather than hides.

The frontends' training layers ("auto", their default) consult it where the fp8 GEMM
kernels would run a call; on a device without them (CPU; MX and NVFP4 before sm_100)
nothing changes: the layer is there for its numerics, not its speed. When a layer is
built, `layer_may_pay` tells whether a call of `MAX_TOKENS` tokens would pay, traced
(the case most in fp8's favour: a layer does not know whether it will be compiled); a
layer that would not says so, and all its calls run in high precision. The high-precision call computes what the layer's float model
computes; the recipe's numerics apply to the calls that quantize.
"""

import dataclasses

MAX_TOKENS = 2**17  # tokens a call, at most, that a layer is expected to see
# fp8 runs where predicted this much faster at least: a near tie goes to high precision,
# whose numerics are the float model's (the sweep's one wrong call was a 1% predicted win).
MARGIN = 0.95


@dataclasses.dataclass(frozen=True)
class Costs:
    """What one training call (forward + backward) costs a recipe on one device.

    Attributes:
      fp8_tflops: the recipe's three GEMMs' rate, 6·M·K·N flops a call.
      bf16_tflops: the high-precision GEMMs' rate.
      cast_bytes: bytes the casts move per element of x, w and dy (reads of the
        high-precision tensor for the amax and the cast, writes of each orientation's
        codes, the transposed copy where there is one).
      bandwidth_tb_s: the device's memory bandwidth as the casts reach it.
      fp8_host_ms, bf16_host_ms: a call's host time.
      overlap: the share of min(host, device) a call still pays (0: full overlap).
    """

    fp8_tflops: float
    bf16_tflops: float
    cast_bytes: float
    bandwidth_tb_s: float
    fp8_host_ms: float
    bf16_host_ms: float
    overlap: float

    def fp8_ms(self, m: int, k: int, n: int, traced: bool = False) -> float:
        casts = (m * k + k * n + m * n) * self.cast_bytes / (self.bandwidth_tb_s * 1e9)
        device = casts + _gemm_ms(m, k, n, self.fp8_tflops)
        return device if traced else _call_ms(self.fp8_host_ms, device, self)

    def bf16_ms(self, m: int, k: int, n: int, traced: bool = False) -> float:
        device = _gemm_ms(m, k, n, self.bf16_tflops)
        return device if traced else _call_ms(self.bf16_host_ms, device, self)


def _gemm_ms(m: int, k: int, n: int, tflops: float) -> float:
    return 6 * m * k * n / (tflops * 1e9)


def _call_ms(host: float, device: float, c: Costs) -> float:
    return max(host, device) + c.overlap * min(host, device)


# H200 (sm_90), torch 2.11 eager, bench/small_shape_costs.py at 5549e26
# (bench/results/2026-12-02_5549e26_small_shape_costs.json). The host times are the
# sweep's fastest calls; the rates are those of its largest shapes; cast_bytes counts
# each recipe's cast passes (docs/performance.md, "Small shapes").
_H200 = {"bf16_tflops": 700.0, "bandwidth_tb_s": 3.3, "bf16_host_ms": 0.15, "overlap": 0.25}
COSTS = {
    # x, w, dy: an amax read and a cast read (2 + 2 bytes), the codes written as they
    # lie and transposed (1 + 1)
    "float8_tensorwise": Costs(fp8_tflops=1300.0, cast_bytes=6, fp8_host_ms=1.96, **_H200),
    # x, w, dy: one fused cast of both orientations (2 + 2 read, 1 + 1 written)
    "float8_rowwise": Costs(fp8_tflops=1300.0, cast_bytes=6, fp8_host_ms=2.48, **_H200),
    # the wgrad GEMM in bf16: two fp8 GEMMs and one bf16 GEMM
    "float8_rowwise_gw_hp": Costs(fp8_tflops=990.0, cast_bytes=6, fp8_host_ms=2.01, **_H200),
}
DEFAULT_RECIPE = "float8_rowwise"  # whose costs a recipe without its own uses


def costs(recipe: str | None) -> Costs:
    """The costs of `recipe` (a name), or of `DEFAULT_RECIPE` for one not measured (a
    guess: the module docstring)."""
    return COSTS.get(recipe or DEFAULT_RECIPE, COSTS[DEFAULT_RECIPE])


def call_pays(
    tokens: int,
    in_features: int,
    out_features: int,
    recipe: str | None = None,
    traced: bool = False,
) -> bool:
    """Whether a call of `tokens` tokens through a K -> N layer is predicted faster in fp8
    (and the layer is not one that said, when built, that it trains in high precision).
    traced: the call is part of a compiled graph (the module docstring)."""
    return layer_may_pay(in_features, out_features, recipe) and _faster_in_fp8(
        tokens, in_features, out_features, recipe, traced
    )


def layer_may_pay(in_features: int, out_features: int, recipe: str | None = None) -> bool:
    """Whether a traced call of `MAX_TOKENS` tokens through this layer would pay."""
    return _faster_in_fp8(MAX_TOKENS, in_features, out_features, recipe, traced=True)


def _faster_in_fp8(m: int, k: int, n: int, recipe: str | None, traced: bool) -> bool:
    c = costs(recipe)
    return c.fp8_ms(m, k, n, traced) < MARGIN * c.bf16_ms(m, k, n, traced)


@dataclasses.dataclass(frozen=True)
class Decision:
    """What the policy decides for one call through a K -> N layer: the predicted times
    of both (device time alone where traced) and whether fp8 runs."""

    tokens: int
    in_features: int
    out_features: int
    recipe: str
    traced: bool
    fp8_ms: float
    high_precision_ms: float
    fp8: bool


def decide(
    tokens: int,
    in_features: int,
    out_features: int,
    recipe: str | None = None,
    traced: bool = False,
) -> Decision:
    """`call_pays` with the predictions behind it (`lowp_torch.small_shapes_report`)."""
    c, k, n = costs(recipe), in_features, out_features
    return Decision(
        tokens=tokens,
        in_features=k,
        out_features=n,
        recipe=recipe or DEFAULT_RECIPE,
        traced=traced,
        fp8_ms=c.fp8_ms(tokens, k, n, traced),
        high_precision_ms=c.bf16_ms(tokens, k, n, traced),
        fp8=call_pays(tokens, k, n, recipe, traced),
    )


def describe(
    tokens: int | None,
    in_features: int,
    out_features: int,
    recipe: str | None = None,
    traced: bool = False,
) -> str:
    """Why a layer or call runs in high precision, for logs: the two predicted times (of
    a traced call, device time alone, where `tokens` is None: `layer_may_pay`'s case)."""
    m = MAX_TOKENS if tokens is None else tokens
    d = decide(m, in_features, out_features, recipe, traced or tokens is None)
    at = f"M*K*N = {m}*{in_features}*{out_features}"
    at += " (the most tokens expected)" if tokens is None else ""
    at += ", traced" if d.traced else ""
    return (
        f"{at}: predicted {d.fp8_ms:.3f} ms in fp8 against {d.high_precision_ms:.3f} ms in "
        f"high precision; fp8 runs where predicted at least {1 - MARGIN:.0%} faster"
    )


def report(layers, tokens: int, traced: bool, traced_as: str = "traced") -> str:
    """The table both frontends' `small_shapes_report` print: for each layer (name,
    in_features, out_features, recipe name, forced), what a call of `tokens` tokens runs
    where the recipe's fp8 GEMM kernels run, fp8 or high precision, with the predicted
    times of both (`decide`; traced: device time alone). `forced`: the layer quantizes
    whatever the policy says (small_shapes="quantize"). `traced_as` names the traced
    mode in the header ("compiled", "jitted").

    Raises:
      ValueError: tokens is not a positive int.
    """
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"tokens must be a positive int, got {tokens!r}")
    rows = [("layer", "K -> N", "recipe", "fp8 ms", "high-precision ms", "runs")]
    for name, k, n, recipe, forced in layers:
        d = decide(tokens, k, n, recipe, traced)
        runs = "fp8 (small_shapes='quantize')" if forced else "fp8" if d.fp8 else "high precision"
        rows.append(
            (name, f"{k} -> {n}", d.recipe, f"{d.fp8_ms:.3f}", f"{d.high_precision_ms:.3f}", runs)
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    kind = f"{traced_as} (device time)" if traced else "eager (with host time)"
    lines = [f"small_shapes at {tokens} tokens a call, {kind}, where fp8 GEMM kernels run:"]
    for row in rows:
        cells = [
            c.ljust(w) if i in (0, 1, 2, 5) else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
