"""Where an fp8 training GEMM cannot pay for its casts: the small-shape policy.

A training layer's three fp8 GEMMs save time in proportion to their work, M·K·N
multiply-adds, while quantizing x, w and dy costs memory passes and kernel launches that
do not shrink with M. Below some size the casts cost more than the GEMMs save, and the
layer is faster in high precision. On the H200 every float8 recipe lost to bf16 up to
M·K·N = 2**36, float8_tensorwise broke even at 2**38 and every recipe won at 2**40;
`MIN_MACS` sits one power of two above tensorwise's break-even (the sweep behind these
numbers: docs/performance.md, "Small shapes").

So the frontends' training layers ("auto", their default) run a call in high precision
when the fp8 GEMM kernels would run it and either of these holds:

- K·N < `MIN_WEIGHT`: even `MAX_TOKENS` tokens a call would not reach `MIN_MACS`. Known
  when the layer is built, and said then;
- M·K·N < `MIN_MACS` for this call's M tokens.

On a device without such kernels (CPU; MX and NVFP4 before sm_100) nothing changes:
the layer is there for its numerics, not its speed. (The policy looks at the device
and the recipe, not at every reason a single GEMM might still be emulated there, such
as K or N off a multiple of 16 without padding: such a small call runs in high
precision too, which is faster than its emulation.) The high-precision call computes what
the layer's float model computes; the quantized recipe's numerics apply to the calls
that quantize.
"""

MIN_MACS = 2**39  # M*K*N below which an fp8 training GEMM triple loses to bf16
MAX_TOKENS = 2**17  # tokens a call, at most, that a layer is expected to see
MIN_WEIGHT = MIN_MACS // MAX_TOKENS  # K*N below which no call of <= MAX_TOKENS reaches MIN_MACS


def layer_may_pay(in_features: int, out_features: int) -> bool:
    """Whether a layer of this K, N can reach `MIN_MACS` at up to `MAX_TOKENS` tokens."""
    return in_features * out_features >= MIN_WEIGHT


def call_pays(tokens: int, in_features: int, out_features: int) -> bool:
    """Whether a call of `tokens` tokens is large enough for the fp8 GEMMs to win."""
    return layer_may_pay(in_features, out_features) and (
        tokens * in_features * out_features >= MIN_MACS
    )


def describe(tokens: int | None, in_features: int, out_features: int) -> str:
    """Why a layer or call runs in high precision, for logs."""
    if not layer_may_pay(in_features, out_features):
        return (
            f"K*N = {in_features}*{out_features} < {MIN_WEIGHT}: below {MIN_MACS} "
            f"multiply-adds even at {MAX_TOKENS} tokens, where fp8 casts cost more than "
            "the fp8 GEMMs save"
        )
    return (
        f"M*K*N = {tokens}*{in_features}*{out_features} < {MIN_MACS}: fp8 casts cost "
        "more than the fp8 GEMMs save at this size"
    )
