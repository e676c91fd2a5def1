"""Another tool's checkpoint tensor dequantized as its producer does, in JAX.

The core gives the producer's rule as a plan (`lowp.extend.producer_plan`: a code-value
table, a per-group float32 multiplier, two dtypes); this runs it on jax arrays, bit for
bit as the NumPy reference and the producer. No torch needed.
"""

import jax.numpy as jnp

import lowp
from lowp import extend
from lowp_jax import _groups, _layouts

_JAX_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def dequantize_checkpoint(q: lowp.QTensor, out_dtype: str | None = None):
    """The producer's dequantization of `q` (a QTensor `lowp.load` read from another
    tool's checkpoint) as a jax array.

    Args:
      q: a lowp.QTensor whose `origin` is set.
      out_dtype: "float32", "bfloat16", "float16", or None for the producer's own.
    """
    plan = extend.producer_plan(q, out_dtype)
    codes = jnp.asarray(q.codes)
    if q.scheme.fmt == "float4_e2m1fn":
        codes = _layouts.unpack_fp4(codes)
    multiplier = _groups.expand(jnp.asarray(plan.multiplier), q.scheme, q.shape)
    product = jnp.asarray(plan.table)[codes.astype(jnp.int32)] * multiplier
    return product.astype(_JAX_DTYPES[plan.mid_dtype]).astype(_JAX_DTYPES[plan.out_dtype])
