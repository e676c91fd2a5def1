"""Producer scale rules: quantize as a producer does, to the bytes it would write.

`quantize_like(x, scheme, dialect, producer=None)` runs one producer's own scale rule,
step for step in the dtypes it uses; each rule's module gives its arithmetic:

  compressed-tensors  compressed-tensors 0.20's compressor: fp8 tensor / channel / group /
                      block, nvfp4 (`_rules_compressed_tensors`)
  modelopt            ModelOpt 0.47's HF export: fp8 per tensor and per channel, nvfp4
                      (`_rules_modelopt`)
  hf-fp8              transformers 5.24's `Fp8Quantize` (producer "transformers", the
                      default) or DeepSeek-V3's `kernel.py` (producer "deepseek"): 2-D
                      tiles, float32 or ue8m0 scales (`_rules_hf_fp8`)
  torchao             torchao 0.18's `Float8Tensor.from_hp`, its torch kernel: per
                      tensor, row, group or block (`_rules_torchao`)

A scheme a producer does not write is a ValueError naming it: the rules reproduce
producers, they do not extend them.
"""

import numpy as np

from lowp import _qtensor, _schemes
from lowp.checkpoints import _origin
from lowp.checkpoints import _rules_compressed_tensors as _ct
from lowp.checkpoints import _rules_hf_fp8 as _hf
from lowp.checkpoints import _rules_modelopt as _mo
from lowp.checkpoints import _rules_torchao as _ao
from lowp.checkpoints._rule_steps import HP

# dialect -> the producers lowp reproduces, the default first
PRODUCERS: dict[str, tuple[str, ...]] = {
    _origin.COMPRESSED_TENSORS: (_origin.COMPRESSED_TENSORS,),
    _origin.MODELOPT: (_origin.MODELOPT,),
    _origin.HF_FP8: (_hf.TRANSFORMERS, _hf.DEEPSEEK),
    _origin.TORCHAO: (_origin.TORCHAO,),
}
_FLOAT_SCHEMES = (
    _schemes.TensorScaling,
    _schemes.AxisScaling,
    _schemes.GroupScaling,
    _schemes.BlockScaling,
)


def quantize_like(
    x: np.ndarray, scheme: _schemes.Scheme, dialect: str, producer: str | None = None
) -> _qtensor.QTensor:
    """`x` quantized by a producer's own scale rule, to the bytes it stores.

    Args:
      x: float32, bfloat16 or float16 weights (out, in), finite.
      scheme: what the producer writes, in lowp's terms:
        compressed-tensors: TensorScaling, AxisScaling(axis=-1), GroupScaling(axis=-1)
          or BlockScaling of float8_e4m3fn without pow2, or NVFP4Scaling();
        modelopt: TensorScaling or AxisScaling(axis=-1) of float8_e4m3fn without pow2,
          or NVFP4Scaling();
        hf-fp8: BlockScaling of float8_e4m3fn, pow2=True for `scale_fmt: "ue8m0"`;
        torchao: as compressed-tensors' fp8, BlockScaling only of a 2-D weight the
          tiles divide.
      dialect: "compressed-tensors", "modelopt", "hf-fp8" or "torchao".
      producer: which producer of the dialect (`PRODUCERS[dialect]`); None for the
        first. hf-fp8 has "transformers" and "deepseek".

    Returns:
      A QTensor whose `origin` is the dialect, as `lowp.load` of the producer's file gives.

    >>> import numpy as np, lowp
    >>> w = np.linspace(-1, 1, 256 * 128, dtype=np.float32).reshape(128, 256)
    >>> tiles = lowp.BlockScaling(block=(128, 128))
    >>> q = lowp.checkpoints.quantize_like(w, tiles, "hf-fp8")
    >>> q.scale.shape, q.origin.names
    ((1, 2), ('weight', 'weight_scale_inv'))
    """
    if dialect not in PRODUCERS:
        raise ValueError(
            f"producer scale rules: lowp reproduces {tuple(PRODUCERS)}, not {dialect!r}"
        )
    producer = PRODUCERS[dialect][0] if producer is None else producer
    if producer not in PRODUCERS[dialect]:
        raise ValueError(
            f"producer {producer!r}: lowp reproduces {PRODUCERS[dialect]} for {dialect}"
        )
    hp_name = next((name for name, dtype in HP.items() if getattr(x, "dtype", None) == dtype), None)
    if hp_name is None:
        raise TypeError(
            "quantize_like takes a float32, bfloat16 or float16 numpy array, got "
            f"{getattr(x, 'dtype', type(x))}"
        )
    xf = x.astype(np.float32)
    if not np.isfinite(xf).all():
        raise ValueError(
            f"quantize_like: the weights hold NaN or Inf; {producer}'s rule is undefined there"
        )
    scheme.check_shape(x.shape)
    nvfp4 = isinstance(scheme, _schemes.NVFP4Scaling) and scheme == _schemes.NVFP4Scaling()
    fp8 = isinstance(scheme, _FLOAT_SCHEMES) and scheme.fmt == "float8_e4m3fn"
    float_scales = fp8 and not getattr(scheme, "pow2", False)  # what the others store
    along_in = getattr(scheme, "axis", -1) % x.ndim == x.ndim - 1  # the producers' `in`
    if dialect == _origin.HF_FP8:
        if fp8 and isinstance(scheme, _schemes.BlockScaling) and x.ndim == 2:
            rule = _hf.transformers if producer == _hf.TRANSFORMERS else _hf.deepseek
            return rule(xf, scheme, hp_name)
        raise ValueError(f"{producer} writes 2-D float8_e4m3fn BlockScaling, not {scheme}")
    if dialect == _origin.MODELOPT:
        if nvfp4:
            return _mo.nvfp4(xf, hp_name)
        per_tensor = isinstance(scheme, _schemes.TensorScaling)
        per_row = isinstance(scheme, _schemes.AxisScaling) and along_in and x.ndim == 2
        if float_scales and (per_tensor or per_row):
            return _mo.fp8(xf, scheme, hp_name)
        raise ValueError(
            f"ModelOpt writes fp8 per tensor or per row, or NVFP4Scaling(); not {scheme}"
        )
    if dialect == _origin.TORCHAO:
        whole_tiles = not isinstance(scheme, _schemes.BlockScaling) or (
            x.ndim == 2 and all(n % b == 0 for n, b in zip(x.shape, scheme.block, strict=True))
        )
        if float_scales and along_in and whole_tiles:
            return _ao.float8(xf, scheme, hp_name)
        raise ValueError(
            f"torchao's Float8Tensor groups per tensor, row, group along `in` or whole "
            f"2-D blocks; not {scheme} of shape {tuple(x.shape)}"
        )
    if nvfp4:
        return _ct.nvfp4(xf, hp_name)
    if float_scales and along_in:
        return _ct.fp8(xf, scheme, hp_name)
    raise ValueError(f"compressed-tensors has no rule lowp reproduces for {scheme}")
