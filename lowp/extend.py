"""The backend interface: what a frontend may use of the core beyond `lowp`'s public names.

`lowp_torch`, `lowp_jax` and the applications (`lowp_apps`) import `lowp` and this
module, nothing else of the core (tests/test_layers.py walks their sources to hold them to
it). The public names (`lowp.quantize`, the scheme classes, `lowp.Recipe`, ...) are for
users; these are for code that implements lowp's numerics on another array library and
must agree with the reference on every rule that is not an array operation: which
elements a scheme groups, what shape its stored arrays have, what a stored scale means,
when a training GEMM pays for its casts.

Formats
  FLOAT8_E4M3FN, FLOAT4_E2M1FN   the element formats a frontend names in its arithmetic.
  element_format(name)           the Format of an element format; ValueError naming it.

Schemes
  Every scheme carries its geometry (`lowp._schemes` lists the protocol): `family`
  ("float", "mx", "nvfp4": the branch of the arithmetic a backend runs), `tiles(rank)`
  (the extent of a group along each axis), `scale_shape`, `scale_format`,
  `permuted(dims)` (the scheme of a transpose) and `spec` (its text, which `from_spec`
  reads back: custom-op keys, command lines). A frontend dispatches on the family and
  reads groups off the tiles, so a new scheme of an existing family needs no frontend code.
  SCHEME_TYPES                   the scheme classes (pickling allowlists, listings).
  check_scheme(scheme)           TypeError naming anything that is not a scheme.
  normalize_axis(axis, rank, scheme)
                                 a scheme's axis as an index into a shape; ValueError naming it.
  scale_format(scheme)           scheme.scale_format: float32, float8_e8m0fnu or float8_e4m3fn.
  MX_MODES                       the MX scale-exponent rules.
  from_spec(text)                a scheme from its command-line text (`mx:fmt=...:mode=rceil`).
  expand_groups(g, scheme, shape)
                                 a scale-shaped NumPy array broadcast over the elements.
  group_reduction(shape, scheme), group_broadcast(shape, scheme)
                                 the shape arithmetic of reducing to one value a group
                                 (pad, split, axes) and of broadcasting back (grid, full,
                                 padded): a frontend's group functions are these plus its
                                 own pad, reshape, max and broadcast.

Stored arrays (spec §5)
  HP_DTYPES                      the high-precision dtypes a quantized tensor comes from.
  check_layout(owner, scheme, shape, hp_dtype, scale_layout) -> StoredLayout
                                 validate a quantized tensor's metadata; the shapes and
                                 scale format its arrays must have.
  codes_shape, stored_scale_shape, blocked_matrix_shape, cublas_blocked_shape
                                 the pieces of that answer, for a frontend's own checks.
  empty_span_problem(shape)      why an empty shape spans more than lowp lets one claim
                                 (MAX_EMPTY_SPAN), or None: work that follows a shape
                                 must not grow with dims no byte backs.
  poisoned_groups(q)             which groups of a QTensor a NaN/Inf poisoned (spec §6).
  slab_plan(shape, scheme, chunk_elements, contiguous=, name=) -> SlabPlan
                                 how `lowp.quantize` cuts an input into slabs of whole
                                 groups (rows, the scales of each slab, whether the amax
                                 of every slab comes first): a frontend that quantizes
                                 in slabs cuts the same way.
  check_chunk_elements(n, name)  TypeError / ValueError naming `name` unless a positive int.

Arithmetic constants and rules
  EPS                            the floor on amax for float scales (spec §3.1).
  random_source(rounding, random_bits, seed, offset_is_zero, name)
                                 where stochastic rounding's bits come from, checked.

How a recipe runs a linear layer (spec §8)
  LinearPlan.of(recipe)          the three GEMMs' plans (GemmPlan, None in high
                                 precision), each operand's (OperandPlan: tensor,
                                 orientation, scheme, reused codes, the scheme along the
                                 tensor's first axis), what each GEMM keeps for a later
                                 one (`keeps_codes`), and `check(m, k, n)`, the shape
                                 check naming the GEMM, operand and dim.
  DIM_NAMES                      what "M", "K", "N" are in a layer's terms.
  shard_groups(scheme, axis, local)
                                 the extent of a scheme's groups along a 2-D tensor's
                                 split axis that a shard of `local` holds whole, None
                                 where each group spans every shard; ValueError naming
                                 the shard and the block it would cut (`lowp._shards`:
                                 FSDP gathers, JAX sharding, tensor parallel).
  data_offset(bits)              the stochastic-rounding offset of an operand: its
                                 float32 bit patterns summed mod 2**32.
  hadamard_transform(x, s, stack=, ftz=)
                                 the random Hadamard transform in its fixed float32
                                 order, run with the backend's array ops; the signs
                                 from `OperandPlan.signs`.
  hadamard_signs(seed, layer, shape)
                                 the transform's 16 signs (+1 or -1, float32) for a
                                 reduction of `shape` (spec §8).

Other tools' checkpoints (docs/checkpoints.md)
  producer_plan(q, out_dtype)    a loaded QTensor's producer dequantization as
                                 RN_out(RN_mid(table[code] * multiplier)): the code-value
                                 table, per-group float32 multiplier and the two dtypes,
                                 for a frontend to run bit for bit on its own arrays.
How a recipe runs the grouped GEMMs of a mixture of experts (spec §10)
  GroupedPlan.of(recipe)         each grouped GEMM's operands (GroupedGemm; GroupedOperand: tensor,
                                 kind "rows" / "experts" / "tokens", scheme), and
                                 `check(k, n)`, the feature dims' shape check.
  check_grouped_scheme(scheme, kind)
                                 ValueError unless a scheme can scale that kind of operand.
  check_group_sizes(sizes, tokens), group_sizes_from_offs(offs, tokens)
                                 the canonical group sizes (int64) from either form.
  token_capacity(tokens, experts, block)
                                 MX scale slots per feature of an operand along tokens.
  token_segments(group_sizes, block)
                                 the run of tokens each scale covers (NumPy; frontends
                                 mirror it with their own ops).
  pair_scheme(scheme)            the scheme of the pair trick: a frontend quantizes
                                 stack([x, amax of x's group], -1) with it.
  quantize_grouped(t, scheme, group_sizes, kind) -> GroupedQTensor
                                 the NumPy reference of a grouped operand's bytes.

The small-shape policy of the training layers (spec §8)
  call_pays, layer_may_pay, describe_small_shape
  decide_small_shape(tokens, k, n, recipe, traced) -> SmallShapeDecision
                                 the predicted times behind call_pays, for reports.
  small_shapes_table(layers, tokens, traced, traced_as) -> str
                                 the frontends' `small_shapes_report` table.
"""

from lowp._formats import FLOAT4_E2M1FN, FLOAT8_E4M3FN, element_format
from lowp._grouped import (
    GroupedGemm,
    GroupedOperand,
    GroupedPlan,
    GroupedQTensor,
    check_group_sizes,
    check_grouped_scheme,
    group_sizes_from_offs,
    pair_scheme,
    quantize_grouped,
    token_capacity,
    token_segments,
)
from lowp._groups import broadcast as group_broadcast
from lowp._groups import expand as expand_groups
from lowp._groups import reduction as group_reduction
from lowp._hadamard import signs as hadamard_signs
from lowp._hadamard import transform as hadamard_transform
from lowp._layouts import cublas_blocked_shape
from lowp._linear_plan import DIM_NAMES, GemmPlan, LinearPlan, OperandPlan, data_offset
from lowp._qtensor import (
    HP_DTYPES,
    StoredLayout,
    blocked_matrix_shape,
    check_layout,
    codes_shape,
    empty_span_problem,
    stored_scale_shape,
)
from lowp._quantize import EPS, SlabPlan, check_chunk_elements, poisoned_groups, slab_plan
from lowp._rounding import random_source
from lowp._schemes import (
    MX_MODES,
    SCHEME_TYPES,
    check_scheme,
    from_spec,
    normalize_axis,
    scale_format,
)
from lowp._shards import shard_groups
from lowp._small_shapes import Decision as SmallShapeDecision
from lowp._small_shapes import call_pays, layer_may_pay
from lowp._small_shapes import decide as decide_small_shape
from lowp._small_shapes import describe as describe_small_shape
from lowp._small_shapes import report as small_shapes_table
from lowp.checkpoints._dequantize import ProducerPlan, producer_plan, refuse_origin

__all__ = [
    "DIM_NAMES",
    "EPS",
    "FLOAT4_E2M1FN",
    "FLOAT8_E4M3FN",
    "HP_DTYPES",
    "MX_MODES",
    "SCHEME_TYPES",
    "GemmPlan",
    "GroupedGemm",
    "GroupedOperand",
    "GroupedPlan",
    "GroupedQTensor",
    "LinearPlan",
    "OperandPlan",
    "ProducerPlan",
    "SlabPlan",
    "SmallShapeDecision",
    "StoredLayout",
    "blocked_matrix_shape",
    "call_pays",
    "check_chunk_elements",
    "check_group_sizes",
    "check_grouped_scheme",
    "check_layout",
    "check_scheme",
    "codes_shape",
    "cublas_blocked_shape",
    "data_offset",
    "decide_small_shape",
    "describe_small_shape",
    "element_format",
    "empty_span_problem",
    "expand_groups",
    "from_spec",
    "group_broadcast",
    "group_reduction",
    "group_sizes_from_offs",
    "hadamard_signs",
    "hadamard_transform",
    "layer_may_pay",
    "normalize_axis",
    "pair_scheme",
    "poisoned_groups",
    "producer_plan",
    "quantize_grouped",
    "random_source",
    "refuse_origin",
    "scale_format",
    "shard_groups",
    "slab_plan",
    "small_shapes_table",
    "stored_scale_shape",
    "token_capacity",
    "token_segments",
]
