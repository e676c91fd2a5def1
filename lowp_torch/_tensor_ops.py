"""What shape and copy ops mean for a QuantizedTensor: codes and scales move together.

Each op keeps the result quantized exactly (same codes, same scale values, scheme
adjusted) where the scale groups survive it, and otherwise:

- view/reshape, slice/select/split and cat **raise** a ValueError naming the op, the
  scheme and the group they would split (an MX block cut in two, fp4 nibbles parted,
  tensorwise tensors with different scales joined). Nothing is regrouped silently.
- t/transpose/permute have a quantized form for every scheme except two: packed fp4
  codes moved off the last axis (the nibbles of a byte are neighbours along it) and
  block scales whose tiled dims would leave the last two. There the op **dequantizes**
  (the result is a plain tensor of the same values) and logs a warning once, or raises
  if the weight's `LinearConfig.strict` asks for it. Dequantizing keeps a model that
  writes `x @ w.T` by hand running; `F.linear` never transposes (see `_linear`).

A transposed tensor keeps its scheme's meaning by moving the axis: rowwise `(N, K)`
scaled along K (`AxisScaling(axis=-1)`) becomes `(K, N)` with `AxisScaling(axis=-2)`,
codes a column-major view, which is the right operand `torch._scaled_mm` wants.
Axes are spelled from the end, as lowp's presets spell them. What survives an op is the
scheme's to say (`permuted`, `reshaped`, `selected`, and `tiles` for slices and cat), so
these functions hold no rule of any one scheme class.
"""

import functools
import math

import torch

from lowp import extend
from lowp_torch import _log, _storage
from lowp_torch import _qtensor as _qt

_FP4 = "float4_e2m1fn"


def map_parts(q, fn):
    """`q` with `fn` applied to each inner tensor (clone, pin_memory, .to(device))."""
    gs = None if q.global_scale is None else fn(q.global_scale)
    return _qt.replace(q, codes=fn(q.codes), scale=fn(q.scale), global_scale=gs)


def to_copy(
    q, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None
):
    """`q.to(device)` moves codes and scales; `q.to(dtype)` changes the dequantized dtype.

    So `model.to(torch.bfloat16)` after `quantize_` keeps the codes and makes the
    weights dequantize to bfloat16. `memory_format` is ignored (codes keep theirs).
    """
    if layout not in (None, torch.strided):
        raise ValueError(f"_to_copy: a QuantizedTensor is strided, not {layout}")
    if dtype is not None and dtype not in _storage.HP_DTYPES:
        raise TypeError(
            f"_to_copy: a QuantizedTensor's dtype is the dtype it dequantizes to "
            f"({', '.join(map(str, _storage.HP_DTYPES))}), got {dtype}; use .codes for the codes"
        )

    def move(t):
        t = t.to(device=device, non_blocking=non_blocking) if device is not None else t.clone()
        return t.pin_memory() if pin_memory else t

    return _qt.replace(map_parts(q, move), hp_dtype=dtype or q.hp_dtype)


def copy_(dst, src):
    """In-place copy. Into a QuantizedTensor: another one of the same scheme, shape and
    layout (bytes copied), or a plain tensor (quantized with dst's scheme, as
    `load_state_dict` of a float checkpoint into a quantized model does). Into a plain
    tensor: the dequantized values."""
    from lowp_torch import _quantize

    if not isinstance(dst, _qt.QuantizedTensor):
        return dst.copy_(
            _quantize.dequantize(
                src, dst.dtype if dst.dtype in _storage.HP_DTYPES else torch.float32
            )
        )
    if not isinstance(src, _qt.QuantizedTensor):
        src = _quantize.quantize(src.to(dst.device), _qt.scheme_of(dst), name=_name(dst))
        src = _qt.with_scale_layout(src, dst.scale_layout)
    if (_qt.scheme_of(src), tuple(src.shape), src.scale_layout) != (
        _qt.scheme_of(dst),
        tuple(dst.shape),
        dst.scale_layout,
    ):
        raise ValueError(
            f"copy_: source {_qt.scheme_of(src)} {tuple(src.shape)} ({src.scale_layout}) does not match "
            f"destination {_qt.scheme_of(dst)} {tuple(dst.shape)} ({dst.scale_layout})"
        )
    dst.codes.copy_(src.codes)
    dst.scale.copy_(src.scale)
    if dst.global_scale is not None:
        dst.global_scale.copy_(src.global_scale)
    return dst


def permutation(func, rank: int, args) -> list[int]:
    """The dim order of aten.t / aten.transpose.int / aten.permute as a list."""
    name = func.name()
    if name == "aten::t":
        return [1, 0] if rank == 2 else list(range(rank))
    if name == "aten::transpose.int":
        d0, d1 = (d % rank for d in args[:2])
        dims = list(range(rank))
        dims[d0], dims[d1] = d1, d0
        return dims
    return [d % rank for d in args[0]]


def permute(q, dims: list[int], *, op: str):
    """Reorder dims; codes and scales are permuted views, the scheme's axis follows."""
    rank, scheme = q.dim(), _qt.scheme_of(q)
    q = _qt.with_scale_layout(q, "plain")
    if scheme.fmt == _FP4 and dims[-1] != rank - 1:
        return _no_quantized_form(
            q,
            op,
            dims,
            "it would move packed fp4 codes off the last axis, "
            "where the two nibbles of a byte are neighbours",
        )
    compiling = torch.compiler.is_compiling()  # no lru_cache for Dynamo to trace
    new_scheme = scheme.permuted(dims) if compiling else _permuted(scheme, tuple(dims))
    if new_scheme is None:
        return _no_quantized_form(
            q,
            op,
            dims,
            "its scale groups do not survive it: block scales tile the last two dims "
            "and this moves a tiled dim into a batch dim",
        )
    codes, shape = q.codes.permute(dims), tuple(q.shape[d] for d in dims)
    scale = q.scale.permute(dims) if q.scale.dim() == rank else q.scale  # () for one scale
    return _qt.view_of(q, codes, scale, new_scheme, shape)


@functools.lru_cache(maxsize=256)
def _permuted(scheme, dims: tuple[int, ...]):
    """`scheme.permuted(dims)`, made once per scheme and permutation (a training layer
    transposes its operands at every call)."""
    return scheme.permuted(list(dims))


def reshape(q, shape, *, op: str):
    """view/reshape, where every scale group stays one group of the new shape."""
    old = tuple(q.shape)
    new = _infer_shape(shape, old, op)
    scheme = _qt.scheme_of(q)
    q = _qt.with_scale_layout(q, "plain")
    new_scheme = scheme.reshaped(old, new)
    if new_scheme is None:
        raise _error(
            op,
            q,
            f"to {new}: its scale groups would not stay whole (a scaled axis must stay one "
            "dim with the same dims before and after it; block tiles keep the last dim, "
            "and rows merge only in whole tiles)",
        )
    try:
        new_scheme.check_shape(new)
    except ValueError as e:
        raise _error(op, q, f"to {new}: {e}") from e
    codes = q.codes.reshape(extend.codes_shape(new_scheme, new))
    scale = q.scale.reshape(new_scheme.scale_shape(new))
    return _qt.replace(q, codes=codes, scale=scale, scheme=new_scheme, shape=new)


def slice_(q, dim=0, start=None, end=None, step=1):
    """aten.slice along `dim`, refused where it would cut a scale block or an fp4 byte."""
    shape, scheme = tuple(q.shape), _qt.scheme_of(q)
    rank = len(shape)
    d = dim % rank
    start, end = _clamp_range(start, end, shape[d])
    q = _qt.with_scale_layout(q, "plain")
    what = f"[{start}:{end}:{step}] along dim {dim}"
    if scheme.fmt == _FP4 and d == rank - 1 and (step != 1 or start % 2 or (end - start) % 2):
        raise _error(
            "slice",
            q,
            f"{what} would split packed fp4 bytes (two codes a byte along "
            "the last dim): start and length must be even, step 1",
        )
    tile = scheme.tiles(rank)[d]  # the extent of a scale group along d
    if tile is None:  # one group spans d: its scale stays whole
        scale_range = None
    elif tile == 1:
        scale_range = (start, end, step)
    else:
        if step != 1 or start % tile:
            raise _error(
                "slice",
                q,
                f"{what} would cut through a scale group of {tile} elements along it: "
                f"start must be a multiple of {tile}, step 1",
            )
        scale_range = (start // tile, -(-end // tile) if end > start else start // tile, 1)
    if scheme.fmt == _FP4 and d == rank - 1:
        codes = _take(q.codes, d, start // 2, end // 2, 1)
    else:
        codes = _take(q.codes, d, start, end, step)
    scale = q.scale if scale_range is None else _take(q.scale, d, *scale_range)
    new_shape = shape[:d] + (len(range(start, end, step)),) + shape[d + 1 :]
    try:  # a partial group only where the scheme admits one (BlockScaling's edge tiles)
        scheme.check_shape(new_shape)
    except ValueError as e:
        raise _error("slice", q, f"{what} would cut through a scale group: {e}") from e
    return _qt.replace(q, codes=codes, scale=scale, shape=new_shape)


def select(q, dim: int, index: int):
    """aten.select (`w[i]`): drops `dim`; refused along a scaled axis or a tiled dim."""
    shape, scheme = tuple(q.shape), _qt.scheme_of(q)
    rank = len(shape)
    d, i = dim % rank, index % shape[dim] if shape[dim] else index
    q = _qt.with_scale_layout(q, "plain")
    new_scheme = scheme.selected(d, rank)
    if new_scheme is None or (scheme.fmt == _FP4 and d == rank - 1):
        raise _error(
            "select",
            q,
            f"index {index} along dim {dim}: that dim is grouped under "
            "one scale (or packed), so a single index of it has no quantized form",
        )
    scale = q.scale.select(d, i) if q.scale.dim() == rank else q.scale  # () for one scale
    return _qt.replace(
        q,
        codes=q.codes.select(d, i),
        scale=scale,
        scheme=new_scheme,
        shape=shape[:d] + shape[d + 1 :],
    )


def split(q, split_size, dim=0):
    """aten.split / split_with_sizes: slices, each checked as `slice_` checks."""
    size = q.shape[dim]
    if isinstance(split_size, int):
        sizes = [min(split_size, size - s) for s in range(0, size, split_size)] or [0]
    else:
        sizes = list(split_size)
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    return [slice_(q, dim, s, s + n, 1) for s, n in zip(starts, sizes, strict=False)]


def cat(tensors, dim=0):
    """aten.cat of QuantizedTensors of one scheme, where the scale groups line up."""
    qs = list(tensors)
    if not all(isinstance(t, _qt.QuantizedTensor) for t in qs):
        raise TypeError("cat: mixes QuantizedTensors and plain tensors; dequantize() first")
    q0 = _qt.with_scale_layout(qs[0], "plain")
    qs = [_qt.with_scale_layout(q, "plain") for q in qs]
    scheme, rank = _qt.scheme_of(q0), q0.dim()
    d = dim % rank
    for q in qs[1:]:
        if _qt.scheme_of(q) != scheme or q.hp_dtype != q0.hp_dtype or q.dim() != rank:
            raise _error("cat", q, f"cannot join it to {scheme} {q0.hp_dtype} rank {rank}")
    tile = scheme.tiles(rank)[d]  # the extent of a scale group along d
    if tile is None:  # one group spans d: the parts must share its scale
        if not all(torch.equal(q.scale, q0.scale) for q in qs):  # a host sync, once per cat
            raise _error(
                "cat",
                q0,
                f"along dim {dim}: the tensors have different scales, and "
                "the result could hold only one",
            )
        scale = q0.scale
    else:
        if tile > 1 and any(q.shape[d] % tile for q in qs[:-1]):
            raise _error(
                "cat",
                q0,
                f"along dim {dim}: every part but the last must be whole scale groups "
                f"along it (a multiple of {tile})",
            )
        scale = _cat_bytes([q.scale for q in qs], d)
    global_scale = q0.global_scale
    if global_scale is not None and not all(torch.equal(q.global_scale, global_scale) for q in qs):
        raise _error(
            "cat",
            q0,
            "the NVFP4 tensors have different global scales, and the result could hold only one",
        )
    shape = list(q0.shape)
    shape[d] = sum(q.shape[d] for q in qs)
    codes = _cat_bytes([q.codes for q in qs], d)
    return _qt.replace(q0, codes=codes, scale=scale, shape=tuple(shape))


# --- helpers ---


def _no_quantized_form(q, op: str, dims: list[int], why: str):
    message = f"{op} of {_name(q)} ({_qt.scheme_of(q)}, shape {tuple(q.shape)}): {why}"
    if _qt.linear_of(q) is not None and _qt.linear_of(q).strict:
        raise ValueError(f"{message}; refused because LinearConfig.strict is set")
    _log.warn_once(
        f"{op}:{_qt.scheme_of(q)}:{_name(q)}",
        f"{message}; dequantizing to {q.hp_dtype} instead (high-precision math from here; "
        "F.linear(x, w) needs no transpose, and strict=True makes this an error)",
    )
    from lowp_torch import _quantize

    return _quantize.dequantize(q).permute(dims)


def _name(q) -> str:
    return "a QuantizedTensor" if _qt.linear_of(q) is None else repr(_qt.linear_of(q).name)


def _error(op: str, q, what: str) -> ValueError:
    return ValueError(
        f"{op}: cannot {op} {_name(q)} of shape {tuple(q.shape)} quantized with "
        f"{_qt.scheme_of(q)} {what}"
    )


def _cat_bytes(parts: list[torch.Tensor], dim: int) -> torch.Tensor:
    """torch.cat through uint8 for the one-byte dtypes (cat has no kernel for some)."""
    if parts[0].dtype == torch.float32:
        return torch.cat(parts, dim)
    return _storage.as_stored(torch.cat([_storage.as_bytes(p) for p in parts], dim), parts[0].dtype)


def _take(t: torch.Tensor, dim: int, start: int, end: int, step: int) -> torch.Tensor:
    index = (slice(None),) * dim + (slice(start, end, step),)
    if t.dtype in (torch.float8_e8m0fnu, torch.float4_e2m1fn_x2):  # indexing kernels lack them
        return _storage.as_stored(_storage.as_bytes(t)[index], t.dtype)
    return t[index]


def _clamp_range(start, end, size: int) -> tuple[int, int]:
    start = 0 if start is None else start
    end = size if end is None else end
    start = min(max(start + size if start < 0 else start, 0), size)
    end = min(max(end + size if end < 0 else end, 0), size)
    return start, max(end, start)


def _infer_shape(shape, old: tuple, op: str) -> tuple:
    shape = tuple(shape)
    if sum(1 for n in shape if n == -1) > 1:
        raise ValueError(f"{op}: only one dim may be -1, got {shape}")
    if -1 in shape:
        known = math.prod(n for n in shape if n != -1)
        shape = tuple(math.prod(old) // known if n == -1 else n for n in shape)
    if math.prod(shape) != math.prod(old):
        raise ValueError(f"{op}: shape {shape} is invalid for a tensor of shape {old}")
    return shape
