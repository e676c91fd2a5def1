"""Where an fp8 training GEMM cannot pay for its casts: the small-shape policy.

A training layer's three fp8 GEMMs save time in proportion to their work, M·K·N
multiply-adds, while quantizing x, w and dy costs memory passes and kernel launches that
do not shrink with M. Below some size the casts cost more than the GEMMs save, and the
layer is faster in high precision. Measured on the H200 (bench/run.py's sweep, eager
forward + backward against bf16, K = N = 4096 and 8192, M = 16 ... 16384, torch 2.11):
every float8 recipe lost up to M·K·N = 2**36 (0.05x-0.35x of bf16); at 2**38 float8
tensorwise broke even (1.04x at 4096 x 8192 x 8192, 1.00x at 16384 x 4096 x 4096) and
rowwise still lost (0.68x, 0.79x); at 2**40 (16384 x 8192 x 8192) every float8 recipe
won (1.09x-1.34x in that sweep; 1.33x-1.66x in the later linear run, after the
transposed-codes copy got its own kernel). `MIN_MACS` sits one power of two above
tensorwise's break-even.

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
