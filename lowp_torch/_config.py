"""LinearConfig: how a quantized weight behaves in `F.linear` / `mm` (set by `quantize_`)."""

import dataclasses

import lowp
from lowp import extend

KERNELS = ("auto", "scaled_mm", "fbgemm", "emulated")


@dataclasses.dataclass(frozen=True)
class LinearConfig:
    """What a QuantizedTensor weight does when a model multiplies by it.

    `quantize_` attaches one to each weight it quantizes: the weight carries the
    activation config, and its linear override quantizes the input, then dispatches the
    GEMM. A bare QuantizedTensor from `quantize` has none
    and multiplies as its dequantized values.

    Attributes:
      activation: the scheme each input is quantized with at every call (dynamic
        quantization), or None for weight-only quantization: the matmul then runs in
        the input's dtype against the dequantized weight.
      kernel: "auto" (the fastest path this device, torch and shape allow; logged at
        debug level), "scaled_mm", "fbgemm" (refused with the reason where they cannot
        run) or "emulated" (dequantize both, float32 matmul, one rounding).
      fast_accum: let fp8 kernels use Hopper's fast accumulation (the forward-GEMM
        default of torchao and Transformer Engine, spec §8).
      pad_to_16: zero-pad K and N to multiples of 16 for the fp8 kernels (exact: zero
        codes add nothing). Without it, an explicit fp8 kernel refuses such a layer
        with a ValueError naming it, and "auto" runs it emulated, with a warning.
      strict: raise instead of dequantizing when an op cannot keep the quantized
        layout (a transpose of packed fp4 codes, of block scales across a batch dim).
      name: the layer's weight name, for errors and logs.

    >>> LinearConfig(activation=None, name="fc1.weight").kernel
    'auto'
    """

    activation: lowp.Scheme | None = None
    kernel: str = "auto"
    fast_accum: bool = True
    pad_to_16: bool = False
    strict: bool = False
    name: str = "weight"

    def __post_init__(self):
        if self.activation is not None:
            extend.check_scheme(self.activation)
        if self.kernel not in KERNELS:
            raise ValueError(f"LinearConfig.kernel must be one of {KERNELS}, got {self.kernel!r}")
        for field in ("fast_accum", "pad_to_16", "strict"):
            if not isinstance(getattr(self, field), bool):
                raise TypeError(
                    f"LinearConfig.{field} must be a bool, got {getattr(self, field)!r}"
                )
        if not isinstance(self.name, str):
            raise TypeError(f"LinearConfig.name must be a str, got {self.name!r}")
