"""Checkpoint dialects, checked against files the producers' own code wrote.

compressed-tensors and ModelOpt run here: their compressors and quantizers make the
tensors, and their own dequantization is the reference. DeepSeek's scripts and gpt-oss's
converter do not: those files are built from their published layouts (the DeepSeek-V3
model card and `inference/kernel.py`; the gpt-oss model card), and the reference is
transformers' own dequantization of them (`Fp8Dequantize`, `convert_moe_packed_tensors`).
"""

import dataclasses
import json

import ml_dtypes
import numpy as np
import pytest

import lowp
from lowp import checkpoints, extend

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")


def _bits(x) -> np.ndarray:
    """The bit patterns of a torch tensor or numpy array, for exact comparison."""
    if isinstance(x, torch.Tensor):
        width = {4: torch.int32, 2: torch.int16, 1: torch.uint8}[x.element_size()]
        return x.contiguous().view(width).numpy()
    return x.view({4: np.int32, 2: np.int16, 1: np.uint8}[x.dtype.itemsize])


def _numpy(t) -> np.ndarray:
    """A torch tensor's values as numpy, bfloat16 and float8 through ml_dtypes."""
    views = {
        torch.bfloat16: ml_dtypes.bfloat16,
        torch.float8_e4m3fn: ml_dtypes.float8_e4m3fn,
        torch.float8_e8m0fnu: ml_dtypes.float8_e8m0fnu,
    }
    if t.dtype in views:
        return _bits(t).view(views[t.dtype])
    return t.numpy()


def _write(directory, tensors: dict, config: dict, name="model.safetensors"):
    directory.mkdir(exist_ok=True)
    safetensors_torch.save_file(
        {k: v.contiguous() for k, v in tensors.items()}, str(directory / name)
    )
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _weights(shape, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=g, dtype=torch.float32) * 0.05
    w[0, :16] = 0  # an all-zero group: every producer has its own rule for its scale
    return w.to(dtype)


def _assert_every_backend(q, reference) -> None:
    """NumPy (`lowp.dequantize`), PyTorch and JAX dequantize `q` to the producer's
    `reference` bits, in its dtype."""
    import lowp_torch

    expected = _numpy(reference) if isinstance(reference, torch.Tensor) else reference
    ours = lowp.dequantize(q)
    assert ours.dtype == expected.dtype
    np.testing.assert_array_equal(_bits(ours), _bits(expected), err_msg="numpy")
    torch_out = _numpy(lowp_torch.dequantize_checkpoint(q))
    assert torch_out.dtype == expected.dtype
    np.testing.assert_array_equal(_bits(torch_out), _bits(expected), err_msg="torch")
    pytest.importorskip("jax")
    import lowp_jax

    jax_out = np.asarray(lowp_jax.dequantize_checkpoint(q))
    assert jax_out.dtype == expected.dtype
    np.testing.assert_array_equal(_bits(jax_out), _bits(expected), err_msg="jax")


# --- compressed-tensors ---


def _ct_checkpoint(tmp_path, args, weight):
    ct = pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme
    from compressed_tensors.quantization.utils.helpers import (
        calculate_qparams,
        generate_gparam,
        maybe_pad_tensor_for_block_quant,
    )

    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    state = {"weight": weight}
    if args.strategy == "tensor":
        lo, hi = weight.amin(), weight.amax()
    elif args.strategy == "channel":
        lo, hi = weight.amin(-1, keepdim=True), weight.amax(-1, keepdim=True)
    elif args.strategy in ("group", "tensor_group"):
        grouped = weight.unflatten(-1, (-1, args.group_size))
        lo, hi = grouped.amin(-1), grouped.amax(-1)
    else:  # block: the compressor pads to whole blocks, so its scales see padded tiles
        bh, bw = args.block_structure
        padded = maybe_pad_tensor_for_block_quant(weight, (bh, bw))
        tiles = padded.reshape(padded.shape[0] // bh, bh, padded.shape[1] // bw, bw)
        lo, hi = tiles.amin((1, 3)), tiles.amax((1, 3))
    global_scale = None
    if args.strategy == "tensor_group":
        global_scale = generate_gparam(weight.amin(), weight.amax())
        state["weight_global_scale"] = global_scale
    scale, zero_point = calculate_qparams(lo, hi, args, global_scale=global_scale)
    state.update(weight_scale=scale, weight_zero_point=zero_point)
    compressor = NVFP4PackedCompressor if args.num_bits == 4 else FloatQuantizationCompressor
    stored = compressor.compress(state, scheme)
    fmt = "nvfp4-pack-quantized" if args.num_bits == 4 else "float-quantized"
    config = QuantizationConfig(
        config_groups={"group_0": scheme}, format=fmt, quantization_status="compressed"
    )
    quantization_config = config.model_dump(mode="json")
    stored_named = {f"layers.0.proj.{k}": v for k, v in stored.items()}
    stored_named["layers.0.norm.weight"] = torch.ones(weight.shape[-1], dtype=torch.bfloat16)
    path = _write(
        tmp_path / "ct",
        stored_named,
        {"quantization_config": quantization_config, "torch_dtype": "bfloat16"},
    )
    reference = compressor.decompress(stored, scheme)["weight"]
    assert ct is not None
    return path, stored, reference


def _ct_args(strategy, num_bits=8, **fields):
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES

    if strategy == "nvfp4":
        return PRESET_SCHEMES["NVFP4A16"]["weights"]
    return QuantizationArgs(
        num_bits=num_bits, type="float", strategy=strategy, symmetric=True, dynamic=False, **fields
    )


_CT_FP8 = {
    "tensor": ({}, (64, 256)),
    "channel": ({}, (64, 256)),
    "group": ({"group_size": 32}, (64, 256)),
    "block": ({"block_structure": [128, 128]}, (256, 384)),
    "block-partial": ({"block_structure": [128, 128]}, (200, 300)),
}


@pytest.mark.parametrize("case", sorted(_CT_FP8))
@pytest.mark.parametrize("hp", ["bfloat16", "float32"])
def test_compressed_tensors_fp8_reads_the_bytes_and_dequantizes_as_its_decompressor(
    tmp_path, case, hp
):
    fields, shape = _CT_FP8[case]
    args = _ct_args(case.split("-")[0], **fields)
    weight = _weights(shape, dtype=getattr(torch, hp))
    path, stored, reference = _ct_checkpoint(tmp_path, args, weight)

    assert checkpoints.detect(path) == "compressed-tensors"
    loaded = lowp.load(path)
    q = loaded["layers.0.proj.weight"]
    assert isinstance(q, lowp.QTensor) and q.origin.dialect == "compressed-tensors"
    assert q.shape == shape and q.hp_dtype == hp and q.origin.scale_dtype == hp
    np.testing.assert_array_equal(q.codes, _bits(stored["weight"]))
    np.testing.assert_array_equal(
        q.scale.reshape(-1), stored["weight_scale"].float().numpy().reshape(-1)
    )
    assert isinstance(loaded["layers.0.norm.weight"], np.ndarray)  # unquantized: plain
    _assert_every_backend(q, reference)


def test_compressed_tensors_nvfp4_reads_the_encode_global_scale_and_divides_as_it_does(tmp_path):
    weight = _weights((64, 256))
    path, stored, reference = _ct_checkpoint(tmp_path, _ct_args("nvfp4"), weight)

    q = lowp.load(path)["layers.0.proj.weight"]
    assert q.scheme == lowp.NVFP4Scaling() and q.shape == (64, 256)
    np.testing.assert_array_equal(q.codes, stored["weight_packed"].numpy())
    np.testing.assert_array_equal(q.scale, _bits(stored["weight_scale"]))
    g = stored["weight_global_scale"].numpy()
    np.testing.assert_array_equal(q.origin.stored_global_scale, g)
    assert q.global_scale == np.float32(1) / g[0]  # lowp's decode scale: the reciprocal

    _assert_every_backend(q, reference)
    ours = lowp.dequantize(q)
    # lowp's own NVFP4 arithmetic multiplies by 1/g: not the producer's bits everywhere
    lowp_rule = lowp.dequantize(dataclasses.replace(q, origin=None))
    assert (
        np.abs(lowp_rule.astype(np.float32) - ours.astype(np.float32)).max()
        <= np.abs(ours.astype(np.float32)).max() * 2**-7
    )


# --- ModelOpt ---


@pytest.mark.slow  # importing modelopt takes ~20 s of CPU
def test_modelopt_nvfp4_and_fp8_read_and_dequantize_as_its_qtensors(tmp_path):
    pytest.importorskip("modelopt")
    from modelopt.torch.quantization.qtensor.fp8_tensor import FP8QTensor
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

    w4, w8 = _weights((64, 256), seed=1), _weights((32, 128), seed=2)
    packed, block_scale, scale_2 = NVFP4QTensor.quantize(w4, 16)
    # the exporter's float32 scale (amax.float() / 448), as unified_export_hf writes it
    fp8, fp8_scale = FP8QTensor.quantize(w8, scales=w8.abs().amax().float() / 448)
    tensors = {
        "model.fc4.weight": packed._quantized_data,
        "model.fc4.weight_scale": block_scale,
        "model.fc4.weight_scale_2": scale_2.reshape(()),
        "model.fc4.input_scale": torch.tensor(0.5),
    }
    directory = _write(tmp_path / "mo4", tensors, {"torch_dtype": "bfloat16"})
    (directory / "hf_quant_config.json").write_text(
        json.dumps(
            {
                "producer": {"name": "modelopt"},
                "quantization": {"quant_algo": "NVFP4", "group_size": 16},
            }
        )
    )
    loaded = lowp.load(directory)
    q = loaded["model.fc4.weight"]
    assert q.origin.dialect == "modelopt" and q.shape == (64, 256)
    np.testing.assert_array_equal(q.codes, packed._quantized_data.numpy())
    np.testing.assert_array_equal(q.scale, _bits(block_scale))
    assert loaded["model.fc4.input_scale"] == np.float32(0.5)  # activation scale: plain
    reference = packed.dequantize(
        dtype=torch.bfloat16, scale=block_scale, double_scale=scale_2, block_sizes={-1: 16}
    )
    _assert_every_backend(q, reference)

    config = {
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8"},
    }
    directory = _write(
        tmp_path / "mo8",
        {"fc.weight": fp8._quantized_data, "fc.weight_scale": fp8_scale.reshape(())},
        config,
    )
    q = lowp.load(directory)["fc.weight"]
    assert q.scheme == lowp.TensorScaling() and q.scale == fp8_scale.numpy().reshape(())
    reference = fp8.dequantize(dtype=torch.bfloat16, scale=fp8_scale)
    _assert_every_backend(q, reference)


# --- transformers fine-grained fp8 (DeepSeek-V3), built from its published layout ---


def _deepseek_quantize(w: np.ndarray, block: int, ue8m0: bool):
    """DeepSeek-V3's weight layout: e4m3 codes of w / s per 128 x 128 tile, s = amax /
    448 (V3.1's ue8m0: rounded up to a power of two) stored as weight_scale_inv."""
    rows, cols = w.shape
    s = np.zeros((-(-rows // block), -(-cols // block)), np.float32)
    codes = np.zeros(w.shape, ml_dtypes.float8_e4m3fn)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            tile = w[i * block : (i + 1) * block, j * block : (j + 1) * block]
            amax = max(float(np.abs(tile).max()), 1e-4)
            scale = np.float32(amax / 448)
            if ue8m0:
                scale = np.float32(2.0 ** np.ceil(np.log2(scale)))
            s[i, j] = scale
            codes[i * block : (i + 1) * block, j * block : (j + 1) * block] = (tile / scale).astype(
                ml_dtypes.float8_e4m3fn
            )
    return codes, s


@pytest.mark.parametrize("scale_fmt", [None, "ue8m0"])
def test_hf_fp8_weight_scale_inv_is_a_multiplier_and_dequantizes_as_transformers(
    tmp_path, scale_fmt
):
    pytest.importorskip("transformers")
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    w = _weights((300, 260), seed=3, dtype=torch.float32).numpy()
    codes, s = _deepseek_quantize(w, 128, scale_fmt == "ue8m0")
    quant = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    if scale_fmt:
        quant["scale_fmt"] = scale_fmt
    tensors = {
        "model.layers.0.mlp.down_proj.weight": torch.from_numpy(codes.view(np.uint8)).view(
            torch.float8_e4m3fn
        ),
        "model.layers.0.mlp.down_proj.weight_scale_inv": torch.from_numpy(s),
    }
    directory = _write(
        tmp_path / "ds", tensors, {"torch_dtype": "bfloat16", "quantization_config": quant}
    )
    q = lowp.load(directory)["model.layers.0.mlp.down_proj.weight"]
    assert q.scheme == lowp.BlockScaling(block=(128, 128), pow2=scale_fmt == "ue8m0")
    np.testing.assert_array_equal(q.codes, codes.view(np.uint8))
    np.testing.assert_array_equal(q.scale, s)
    # transformers 5.24's dequantization (pad-free here: 300 x 260 has partial tiles,
    # which its reshape refuses), on the whole-tile part, and DeepSeek's kernel.py rule
    whole = (256, 256)
    ref = Fp8Dequantize(None)._dequantize_one(
        tensors["model.layers.0.mlp.down_proj.weight"][: whole[0], : whole[1]],
        torch.from_numpy(s[:2, :2]),
        output_dtype=torch.bfloat16,
    )
    ours = lowp.dequantize(q)
    np.testing.assert_array_equal(_bits(ours[: whole[0], : whole[1]]), _bits(ref))
    full = (
        torch.from_numpy(codes.astype(np.float32))
        * torch.from_numpy(s).repeat_interleave(128, 0)[:300].repeat_interleave(128, 1)[:, :260]
    ).to(torch.bfloat16)
    _assert_every_backend(q, full)


# --- gpt-oss MXFP4, built from its published layout ---


def test_gpt_oss_blocks_and_scales_dequantize_as_transformers(tmp_path):
    pytest.importorskip("transformers")
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    rng = np.random.default_rng(4)
    experts, rows, groups = 2, 8, 4
    blocks = rng.integers(0, 256, (experts, rows, groups, 16), dtype=np.uint8)
    scales = rng.integers(110, 135, (experts, rows, groups), dtype=np.uint8)
    scales[0, 0, 0] = 0  # 2**-127: a subnormal multiplier
    tensors = {
        "model.layers.0.mlp.experts.gate_up_proj_blocks": torch.from_numpy(blocks),
        "model.layers.0.mlp.experts.gate_up_proj_scales": torch.from_numpy(scales),
        "model.layers.0.mlp.experts.gate_up_proj_bias": torch.zeros(experts, rows),
    }
    directory = _write(
        tmp_path / "oss", tensors, {"quantization_config": {"quant_method": "mxfp4"}}
    )
    loaded = lowp.load(directory)
    q = loaded["model.layers.0.mlp.experts.gate_up_proj"]
    assert q.scheme == lowp.MXScaling(fmt="float4_e2m1fn", block=32) and q.shape == (
        experts,
        rows,
        groups * 32,
    )
    np.testing.assert_array_equal(q.codes, blocks.reshape(experts, rows, groups * 16))
    np.testing.assert_array_equal(q.scale, scales)
    reference = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales))
    ours = lowp.dequantize(q)
    np.testing.assert_array_equal(_bits(ours), _bits(reference.transpose(1, 2).contiguous()))
    assert "model.layers.0.mlp.experts.gate_up_proj_bias" in loaded


# --- Files and shards ---


def test_a_sharded_checkpoint_pairs_a_weight_with_its_scale_in_another_shard(tmp_path):
    w = _weights((128, 128), dtype=torch.float32).numpy()
    codes, s = _deepseek_quantize(w, 128, False)
    weight = torch.from_numpy(codes.view(np.uint8)).view(torch.float8_e4m3fn)
    directory = tmp_path / "sharded"
    config = {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    _write(
        directory,
        {"a.weight": weight, "b.bias": torch.zeros(3)},
        config,
        "model-00001-of-00002.safetensors",
    )
    _write(
        directory,
        {"a.weight_scale_inv": torch.from_numpy(s)},
        config,
        "model-00002-of-00002.safetensors",
    )
    weight_map = {
        "a.weight": "model-00001-of-00002.safetensors",
        "b.bias": "model-00001-of-00002.safetensors",
        "a.weight_scale_inv": "model-00002-of-00002.safetensors",
    }
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    loaded = lowp.load(directory)
    assert sorted(loaded) == ["a.weight", "b.bias"]
    np.testing.assert_array_equal(loaded["a.weight"].scale, s)

    (directory / "model-00002-of-00002.safetensors").unlink()
    weight_map["a.weight_scale_inv"] = "model-00001-of-00002.safetensors"
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ValueError, match="'a.weight' has no 'a.weight_scale_inv'"):
        lowp.load(directory)


def test_an_nvfp4_global_scale_in_a_later_shard_is_waited_for(tmp_path):
    path, stored, _ = _ct_checkpoint(tmp_path, _ct_args("nvfp4"), _weights((64, 256)))
    config = json.loads((path / "config.json").read_text())
    tensors = {f"layers.0.proj.{k}": v for k, v in stored.items()}
    first = {k: v for k, v in tensors.items() if not k.endswith("global_scale")}
    second = {k: v for k, v in tensors.items() if k.endswith("global_scale")}
    directory = tmp_path / "sharded"
    _write(directory, first, config, "a.safetensors")
    _write(directory, second, config, "b.safetensors")
    weight_map = {**dict.fromkeys(first, "a.safetensors"), **dict.fromkeys(second, "b.safetensors")}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    q = lowp.load(directory)["layers.0.proj.weight"]
    np.testing.assert_array_equal(
        q.origin.stored_global_scale, stored["weight_global_scale"].numpy()
    )


def test_a_lone_file_is_recognised_by_its_names_and_a_lowp_file_is_unchanged(tmp_path):
    blocks = np.zeros((4, 2, 16), np.uint8)
    path = tmp_path / "experts.safetensors"
    safetensors_torch.save_file(
        {
            "e.down_blocks": torch.from_numpy(blocks),
            "e.down_scales": torch.full((4, 2), 127, dtype=torch.uint8),
        },
        str(path),
    )
    assert checkpoints.detect(path) == "gpt-oss"
    assert lowp.load(path)["e.down"].origin.dialect == "gpt-oss"

    mine = tmp_path / "lowp.safetensors"
    lowp.save(mine, {"w": lowp.quantize(np.ones((2, 32), np.float32), lowp.MXScaling())})
    assert checkpoints.detect(mine) is None and lowp.load(mine)["w"].origin is None


def test_an_unknown_quant_method_is_refused_naming_it(tmp_path):
    directory = _write(
        tmp_path / "gptq", {"x": torch.zeros(2)}, {"quantization_config": {"quant_method": "gptq"}}
    )
    with pytest.raises(ValueError, match="'gptq'"):
        lowp.load(directory)


# --- Producer scale rules ---


@pytest.mark.parametrize("case", [*sorted(_CT_FP8), "nvfp4"])
@pytest.mark.parametrize("hp", ["bfloat16", "float32"])
def test_quantize_like_compressed_tensors_gives_its_compressor_bytes(tmp_path, case, hp):
    if case == "nvfp4":
        args, shape, scheme = _ct_args("nvfp4"), (64, 256), lowp.NVFP4Scaling()
    else:
        fields, shape = _CT_FP8[case]
        args = _ct_args(case.split("-")[0], **fields)
        scheme = {
            "tensor": lowp.TensorScaling(),
            "channel": lowp.AxisScaling(axis=-1),
            "group": lowp.GroupScaling(block=32),
        }.get(case.split("-")[0], lowp.BlockScaling(block=(128, 128)))
    weight = _weights(shape, seed=5, dtype=getattr(torch, hp))
    _, stored, _ = _ct_checkpoint(tmp_path, args, weight)

    q = checkpoints.quantize_like(_numpy(weight), scheme, "compressed-tensors")
    if case == "nvfp4":
        np.testing.assert_array_equal(q.codes, stored["weight_packed"].numpy())
        np.testing.assert_array_equal(q.scale, _bits(stored["weight_scale"]))
        np.testing.assert_array_equal(
            q.origin.stored_global_scale, stored["weight_global_scale"].numpy()
        )
    else:
        np.testing.assert_array_equal(q.codes, _bits(stored["weight"]))
        np.testing.assert_array_equal(
            q.scale.reshape(-1), stored["weight_scale"].float().numpy().reshape(-1)
        )


def _transformers_fp8(weight: torch.Tensor, scale_fmt: str):
    """transformers' own Fp8Quantize (what it stores saving a FineGrainedFP8 model):
    (codes, weight_scale_inv, the config it writes)."""
    from types import SimpleNamespace

    from transformers import FineGrainedFP8Config
    from transformers.integrations.finegrained_fp8 import Fp8Quantize

    config = FineGrainedFP8Config(weight_block_size=(128, 128), scale_fmt=scale_fmt)
    op = Fp8Quantize(SimpleNamespace(quantization_config=config))
    out = op._quantize_one("fc.weight", weight)
    return out["fc.weight"], out["fc.weight_scale_inv"], config.to_dict()


def _fp8_tiles(hp_dtype, seed=14) -> torch.Tensor:
    """(256, 384) weights whose 128 x 128 tiles hit the block rules' edges: an all-zero
    tile, tile maxima of exactly 448 * 2**k (amax / 448 a power of two) and one bf16 ulp
    above, where ue8m0's ceiling and the float32 roundings matter."""
    w = _weights((256, 384), seed=seed, dtype=torch.float32)
    w[128:, 256:] = 0
    w[5, 130] = 0.875  # 1.75 * 2**-1
    w[7, 260] = -0.87890625  # one bf16 ulp above 0.875
    w[131, 3] = 1.75
    w[140, 200] = 3.52734375  # one bf16 ulp above 3.5
    return w.to(hp_dtype)


@pytest.mark.parametrize("scale_fmt", ["float", "ue8m0"])
@pytest.mark.parametrize("hp", ["bfloat16", "float32"])
def test_quantize_like_hf_fp8_gives_transformers_fp8quantize_bytes(tmp_path, scale_fmt, hp):
    pytest.importorskip("transformers")
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    weight = _fp8_tiles(getattr(torch, hp))
    codes, scale_inv, config = _transformers_fp8(weight, scale_fmt)
    scheme = lowp.BlockScaling(block=(128, 128), pow2=scale_fmt == "ue8m0")
    q = checkpoints.quantize_like(_numpy(weight), scheme, "hf-fp8")
    np.testing.assert_array_equal(q.codes, _bits(codes))
    np.testing.assert_array_equal(q.scale, scale_inv.float().numpy())
    assert q.scale[1, 2] == 1  # the all-zero tile: transformers' scale 1
    assert q.origin.scale_dtype == {"float": "float32", "ue8m0": "float8_e8m0fnu"}[scale_fmt]

    # transformers' tensors and config as a file: lowp reads them to the same QTensor,
    # dequantizes them as Fp8Dequantize does in every backend, and writes them back
    stored = {"fc.weight": codes, "fc.weight_scale_inv": scale_inv}
    theirs = _write(tmp_path / "tf", stored, {"torch_dtype": hp, "quantization_config": config})
    loaded = lowp.load(theirs)["fc.weight"]
    assert loaded.scheme == scheme and loaded.origin.scale_dtype == q.origin.scale_dtype
    np.testing.assert_array_equal(loaded.codes, q.codes)
    np.testing.assert_array_equal(loaded.scale, q.scale)
    reference = Fp8Dequantize(None)._dequantize_one(codes, scale_inv, output_dtype=weight.dtype)
    _assert_every_backend(loaded, reference)
    checkpoints.save_checkpoint(tmp_path / "ours", {"fc.weight": q}, "hf-fp8")
    ours = _stored(tmp_path / "ours")
    for name, tensor in stored.items():
        assert ours[name].dtype == tensor.dtype, name
        np.testing.assert_array_equal(_bits(ours[name]), _bits(tensor), err_msg=name)


@pytest.mark.parametrize("scale_fmt", [None, "ue8m0"])
def test_quantize_like_deepseek_follows_its_kernel_py(scale_fmt):
    """DeepSeek's own scripts need Triton on a GPU and do not run here: the reference is
    the arithmetic of DeepSeek-V3's `inference/kernel.py` (`act_quant`, HEAD 9b4e978)
    written out in torch float32 over 128 x 128 tiles, partial edge tiles included:
    amax clamped to 1e-4, s = amax / 448, ue8m0 s = exp2(ceil(log2(s))), (x / s) to e4m3."""
    weight = _fp8_tiles(torch.bfloat16)[:200, :300]
    x = weight.float()
    codes = torch.empty(x.shape, dtype=torch.float8_e4m3fn)
    scales = torch.empty(2, 3)
    for i in range(2):
        for j in range(3):
            tile = x[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128]
            s = tile.abs().amax().clamp(min=1e-4) / 448.0
            if scale_fmt == "ue8m0":
                s = torch.exp2(torch.ceil(torch.log2(s)))
            codes[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128] = (tile / s).to(codes.dtype)
            scales[i, j] = s
    scheme = lowp.BlockScaling(block=(128, 128), pow2=scale_fmt == "ue8m0")
    q = checkpoints.quantize_like(_numpy(weight), scheme, "hf-fp8", producer="deepseek")
    np.testing.assert_array_equal(q.codes, _bits(codes))
    np.testing.assert_array_equal(q.scale, scales.numpy())
    assert q.origin.scale_dtype == "float32"


def test_the_two_fine_grained_fp8_producers_store_different_bytes():
    """transformers multiplies by RN32(RN32(1 / amax) * 448), DeepSeek divides by
    RN32(amax / 448): the same weights give different scales and codes (0.13% of codes,
    101 of 256 scales on 2048 x 2048 bf16 normal weights), and an all-zero tile
    different scales (1 against 1e-4 / 448). A trainer matching a server picks one."""
    w = _weights((512, 512), seed=17)
    w[128:256, :128] = 0
    w, tiles = _numpy(w), lowp.BlockScaling(block=(128, 128))
    hf = checkpoints.quantize_like(w, tiles, "hf-fp8", producer="transformers")
    ds = checkpoints.quantize_like(w, tiles, "hf-fp8", producer="deepseek")
    assert (hf.codes != ds.codes).any() and (hf.scale != ds.scale).sum() > 1
    assert hf.scale[1, 0] == 1 and ds.scale[1, 0] == np.float32(np.float32(1e-4) / 448)
    with pytest.raises(ValueError, match="'vllm'.*'transformers', 'deepseek'"):
        checkpoints.quantize_like(w, tiles, "hf-fp8", producer="vllm")
    with pytest.raises(ValueError, match=r"leaves a \(200, 300\) weight unquantized"):
        checkpoints.quantize_like(w[:200, :300], tiles, "hf-fp8")


@pytest.mark.slow  # importing modelopt takes ~20 s of CPU
@pytest.mark.parametrize("granularity", ["tensor", "channel"])
@pytest.mark.parametrize("hp", ["bfloat16", "float32"])
def test_quantize_like_modelopt_fp8_gives_its_exporter_bytes(tmp_path, granularity, hp):
    pytest.importorskip("modelopt")
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export.unified_export_hf import _export_quantized_weight
    from modelopt.torch.quantization.qtensor.fp8_tensor import FP8QTensor

    hp_dtype = getattr(torch, hp)
    weight = _weights((64, 256), seed=15, dtype=hp_dtype)
    model = torch.nn.Sequential(torch.nn.Linear(256, 64, bias=False)).to(hp_dtype)
    with torch.no_grad():
        model[0].weight.copy_(weight)
    config = {"tensor": mtq.FP8_DEFAULT_CFG, "channel": mtq.FP8_PER_CHANNEL_PER_TOKEN_CFG}
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(16)).to(hp_dtype)
    mtq.quantize(model, config[granularity], lambda m: m(x))
    _export_quantized_weight(model[0], hp_dtype)  # what unified_export_hf writes
    codes, scale = model[0].weight.data, model[0].weight_scale

    scheme = lowp.TensorScaling() if granularity == "tensor" else lowp.AxisScaling(axis=-1)
    q = checkpoints.quantize_like(_numpy(weight), scheme, "modelopt")
    np.testing.assert_array_equal(q.codes, _bits(codes))
    np.testing.assert_array_equal(q.scale.reshape(-1), scale.numpy().reshape(-1))

    # the exporter's tensors as a file read to the same QTensor; lowp writes them back
    algo = {"tensor": "FP8", "channel": "FP8_PER_CHANNEL_PER_TOKEN"}[granularity]
    quant = {"quant_method": "modelopt", "quant_algo": algo}
    stored = {"fc.weight": codes, "fc.weight_scale": scale}
    theirs = _write(tmp_path / "mo", stored, {"torch_dtype": hp, "quantization_config": quant})
    loaded = lowp.load(theirs)["fc.weight"]
    assert loaded.scheme == scheme
    np.testing.assert_array_equal(loaded.codes, q.codes)
    np.testing.assert_array_equal(loaded.scale, q.scale)
    # ModelOpt's own fp8 dequantization, its (out,) per-channel scale as (out, 1)
    rows = scale.reshape(-1, 1) if scale.ndim == 1 else scale
    reference = FP8QTensor(codes.shape, hp_dtype, codes).dequantize(dtype=hp_dtype, scale=rows)
    _assert_every_backend(loaded, reference)
    checkpoints.save_checkpoint(tmp_path / "ours", {"fc.weight": q}, "modelopt")
    ours = _stored(tmp_path / "ours")
    for name, tensor in stored.items():
        assert ours[name].dtype == tensor.dtype and ours[name].shape == tensor.shape, name
        np.testing.assert_array_equal(_bits(ours[name]), _bits(tensor), err_msg=name)


# --- Writers ---


@pytest.mark.parametrize("case", ["channel", "nvfp4", "block"])
def test_a_compressed_tensors_file_is_written_back_byte_for_byte(tmp_path, case):
    fields, shape = _CT_FP8.get(case, ({}, (64, 256)))
    args = _ct_args(case, **fields) if case != "nvfp4" else _ct_args("nvfp4")
    path, _, _ = _ct_checkpoint(tmp_path, args, _weights(shape))
    loaded = lowp.load(path)
    checkpoints.save_checkpoint(tmp_path / "again", loaded, "compressed-tensors")
    theirs = safetensors_torch.load_file(str(path / "model.safetensors"))
    ours = safetensors_torch.load_file(str(tmp_path / "again" / "model.safetensors"))
    assert sorted(theirs) == sorted(ours)
    for name in theirs:
        assert theirs[name].dtype == ours[name].dtype, name
        np.testing.assert_array_equal(_bits(ours[name]), _bits(theirs[name]))


@pytest.mark.parametrize(
    "scheme",
    [
        lowp.TensorScaling(),
        lowp.GroupScaling(block=32),
        lowp.AxisScaling(axis=-1),
        lowp.BlockScaling(block=(128, 128)),
        lowp.NVFP4Scaling(),
    ],
)
def test_lowp_quantized_weights_written_as_compressed_tensors_decompress_to_lowp_values(
    tmp_path, scheme
):
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationConfig

    w = _numpy(_weights((128, 256), seed=6, dtype=torch.float32))
    q = lowp.quantize(w, scheme)
    checkpoints.save_checkpoint(tmp_path / "ct", {"fc.weight": q}, "compressed-tensors")
    config = json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]
    quant_scheme = QuantizationConfig.model_validate(config).config_groups["group_0"]
    stored = safetensors_torch.load_file(str(tmp_path / "ct" / "model.safetensors"))
    local = {k.removeprefix("fc."): v for k, v in stored.items()}
    nvfp4 = isinstance(scheme, lowp.NVFP4Scaling)
    compressor = NVFP4PackedCompressor if nvfp4 else FloatQuantizationCompressor
    theirs = compressor.decompress(local, quant_scheme)["weight"].float().numpy()
    ours = lowp.dequantize(q)
    if nvfp4:  # the loader divides by 1 / s_dec and returns bfloat16: within a bf16 ulp
        ours_bf16 = ours.astype(ml_dtypes.bfloat16).astype(np.float32)
        np.testing.assert_allclose(theirs, ours_bf16, rtol=2**-7, atol=0)
        assert (theirs == ours_bf16).mean() > 0.99
    else:
        np.testing.assert_array_equal(theirs, ours)


# --- Every backend ---


def _loaded_examples(tmp_path):
    """One loaded QTensor of each dialect and kind, with its NumPy dequantization."""
    out = {}
    for case in ("group", "nvfp4"):
        fields, shape = _CT_FP8.get(case, ({}, (64, 256)))
        args = _ct_args(case, **fields) if case != "nvfp4" else _ct_args("nvfp4")
        (tmp_path / case).mkdir()
        path, _, _ = _ct_checkpoint(tmp_path / case, args, _weights(shape))
        out[f"ct-{case}"] = lowp.load(path)["layers.0.proj.weight"]
    blocks = np.random.default_rng(7).integers(0, 256, (4, 3, 16), dtype=np.uint8)
    scales = np.array([[0, 127, 140], [120, 126, 255], [1, 2, 3], [130, 131, 132]], np.uint8)
    path = tmp_path / "e.safetensors"
    safetensors_torch.save_file(
        {"e.down_blocks": torch.from_numpy(blocks), "e.down_scales": torch.from_numpy(scales)},
        str(path),
    )
    out["gpt-oss"] = lowp.load(path)["e.down"]
    return out


def test_torch_and_jax_dequantize_checkpoint_tensors_as_numpy_does(tmp_path):
    import lowp_torch

    jnp = pytest.importorskip("jax.numpy")
    import lowp_jax

    for name, q in _loaded_examples(tmp_path).items():
        reference = lowp.dequantize(q)
        # gpt-oss's byte 255 is Inf and 0 * Inf a NaN, whose payload each library picks
        nan = np.isnan(reference.astype(np.float32))
        assert name != "gpt-oss" or nan.any()
        for device in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
            torch_out = _numpy(lowp_torch.dequantize_checkpoint(q, device=device).cpu())
            assert torch_out.dtype == reference.dtype
            where = f"{name} on {device}"
            np.testing.assert_array_equal(
                np.isnan(torch_out.astype(np.float32)), nan, err_msg=where
            )
            np.testing.assert_array_equal(
                _bits(torch_out)[~nan], _bits(reference)[~nan], err_msg=where
            )
        # XLA on CPU flushes subnormal operands and results (lowp_jax/_exact.py): a
        # multiplier or product below 2**-126 (gpt-oss's scale bytes 0..3 here) gives 0
        jax_out = np.asarray(lowp_jax.dequantize_checkpoint(q))
        assert jax_out.dtype == reference.dtype and jnp is not None
        multiplier = extend.expand_groups(extend.producer_plan(q).multiplier, q.scheme, q.shape)
        tiny = (np.abs(reference.astype(np.float32)) < 2.0**-126) | (multiplier < 2.0**-126)
        np.testing.assert_array_equal(np.isnan(jax_out.astype(np.float32)), nan, err_msg=name)
        same = ~nan & ~tiny
        np.testing.assert_array_equal(_bits(jax_out)[same], _bits(reference)[same], err_msg=name)
        flushed = jax_out.astype(np.float32)[tiny] == 0  # on CPU; a GPU may keep them
        assert (flushed | (_bits(jax_out)[tiny] == _bits(reference)[tiny])).all()
        assert name != "gpt-oss" or tiny.any()


def test_load_quantized_takes_a_checkpoint_directory_into_torch_and_jax(tmp_path):
    import lowp_torch

    w = _numpy(_weights((32, 64), seed=8, dtype=torch.float32))
    q = lowp.quantize(w, lowp.AxisScaling(axis=-1))
    bias = np.arange(32, dtype=np.float32)
    checkpoints.save_checkpoint(
        tmp_path / "ct", {"fc.weight": q, "fc.bias": bias}, "compressed-tensors"
    )
    loaded = lowp.load(tmp_path / "ct")["fc.weight"]

    model = torch.nn.Sequential()
    model.add_module("fc", torch.nn.Linear(64, 32))
    lowp_torch.load_quantized(model, tmp_path / "ct")
    weight = lowp_torch.dequantize(model.fc.weight)
    np.testing.assert_array_equal(weight.numpy(), lowp.dequantize(loaded))
    np.testing.assert_array_equal(model.fc.bias.detach().numpy(), bias)

    pytest.importorskip("jax")
    import lowp_jax

    like = {"fc": {"kernel": np.zeros((64, 32), np.float32), "bias": np.zeros(32, np.float32)}}
    names = {("fc", "kernel"): "fc.weight", ("fc", "bias"): "fc.bias"}
    params = lowp_jax.load_quantized(tmp_path / "ct", like, names=lambda path: names[tuple(path)])
    kernel = params["fc"]["kernel"]  # a QArray keeps the file's (out, in)
    np.testing.assert_array_equal(np.asarray(lowp_jax.dequantize(kernel)), lowp.dequantize(loaded))


@pytest.mark.slow  # importing modelopt takes ~20 s of CPU
@pytest.mark.parametrize("hp", ["bfloat16", "float32"])
def test_quantize_like_modelopt_nvfp4_gives_its_quantizer_bytes(hp):
    pytest.importorskip("modelopt")
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

    weight = _weights((64, 256), seed=9, dtype=getattr(torch, hp))
    weight[1, 3] = -0.0  # ModelOpt's sign bit is x < 0: -0 is code 0
    packed, block_scale, scale_2 = NVFP4QTensor.quantize(weight.clone(), 16)
    q = checkpoints.quantize_like(_numpy(weight), lowp.NVFP4Scaling(), "modelopt")
    np.testing.assert_array_equal(q.codes, packed._quantized_data.numpy())
    np.testing.assert_array_equal(q.scale, _bits(block_scale))
    np.testing.assert_array_equal(q.global_scale, scale_2.numpy().reshape(()))


def _stored(directory) -> dict:
    return safetensors_torch.load_file(str(directory / "model.safetensors"))


def test_hf_fp8_and_gpt_oss_files_lowp_writes_dequantize_in_transformers_to_lowp_values(tmp_path):
    pytest.importorskip("transformers")
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    w = _numpy(_weights((256, 384), seed=10, dtype=torch.float32))
    for pow2 in (False, True):  # scale_fmt absent, and "ue8m0"
        q = lowp.quantize(w, lowp.BlockScaling(block=(128, 128), pow2=pow2))
        checkpoints.save_checkpoint(tmp_path / f"fp8-{pow2}", {"fc.weight": q}, "hf-fp8")
        assert checkpoints.detect(tmp_path / f"fp8-{pow2}") == "hf-fp8"
        stored = _stored(tmp_path / f"fp8-{pow2}")
        theirs = Fp8Dequantize(None)._dequantize_one(
            stored["fc.weight"], stored["fc.weight_scale_inv"], torch.float32
        )
        np.testing.assert_array_equal(theirs.numpy(), lowp.dequantize(q))

    experts = _numpy(_weights((2, 8, 64), seed=11, dtype=torch.float32).reshape(2, 8, 64))
    q = lowp.quantize(experts, lowp.MXScaling(fmt="float4_e2m1fn"))
    checkpoints.save_checkpoint(tmp_path / "oss", {"mlp.experts.down_proj": q}, "gpt-oss")
    stored = _stored(tmp_path / "oss")
    theirs = convert_moe_packed_tensors(
        stored["mlp.experts.down_proj_blocks"], stored["mlp.experts.down_proj_scales"]
    )
    ours = lowp.dequantize(q, "bfloat16")
    np.testing.assert_array_equal(_bits(theirs.transpose(1, 2).contiguous()), _bits(ours))


@pytest.mark.slow  # importing modelopt takes ~20 s of CPU
def test_modelopt_files_lowp_writes_dequantize_in_modelopt_to_lowp_values(tmp_path):
    pytest.importorskip("modelopt")
    from modelopt.torch.quantization.qtensor.fp8_tensor import FP8QTensor
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

    w = _numpy(_weights((64, 256), seed=12, dtype=torch.float32))
    q4 = lowp.quantize(w, lowp.NVFP4Scaling())
    checkpoints.save_checkpoint(tmp_path / "mo4", {"fc.weight": q4}, "modelopt")
    s = _stored(tmp_path / "mo4")
    packed = NVFP4QTensor(torch.Size(w.shape), torch.float32, s["fc.weight"])
    theirs = packed.dequantize(
        dtype=torch.float32,
        scale=s["fc.weight_scale"],
        double_scale=s["fc.weight_scale_2"],
        block_sizes={-1: 16},
    )
    np.testing.assert_array_equal(
        theirs.numpy(), lowp.dequantize(q4)
    )  # ModelOpt's zero is +0: == not bits

    for scheme in (lowp.TensorScaling(), lowp.AxisScaling(axis=-1)):
        q8 = lowp.quantize(w, scheme)
        checkpoints.save_checkpoint(tmp_path / "mo8", {"fc.weight": q8}, "modelopt")
        s = _stored(tmp_path / "mo8")
        # ModelOpt's fp8 dequantization broadcasts the scale: its exporter's (out,) per-
        # channel scale multiplies rows as (out, 1), as vLLM and TensorRT-LLM read it
        scale = s["fc.weight_scale"]
        scale = scale.reshape(-1, 1) if scale.ndim == 1 else scale
        theirs = FP8QTensor(torch.Size(w.shape), torch.float32, s["fc.weight"]).dequantize(
            dtype=torch.float32, scale=scale
        )
        np.testing.assert_array_equal(_bits(theirs), _bits(lowp.dequantize(q8)))


# --- torchao's safetensors format ---


@pytest.mark.parametrize("granularity", ["PerRow", "PerTensor"])
def test_torchao_float8_files_read_and_write_as_torchao_does(tmp_path, granularity):
    pytest.importorskip("torchao")
    from torchao.prototype.safetensors.safetensors_support import (
        flatten_tensor_state_dict,
        unflatten_tensor_state_dict,
    )
    from torchao.quantization import granularity as granularities
    from torchao.quantization.quantize_.workflows.float8.float8_tensor import Float8Tensor

    w = _weights((32, 64), seed=13)
    t = Float8Tensor.from_hp(w, granularity=getattr(granularities, granularity)())
    data, metadata = flatten_tensor_state_dict({"fc.weight": t, "fc.bias": torch.zeros(32)})
    path = tmp_path / "ao.safetensors"
    safetensors_torch.save_file(data, str(path), metadata=metadata)

    assert checkpoints.detect(path) == "torchao"
    loaded = lowp.load(path)
    q = loaded["fc.weight"]
    assert q.scheme == (
        lowp.AxisScaling(axis=-1) if granularity == "PerRow" else lowp.TensorScaling()
    )
    np.testing.assert_array_equal(q.codes, _bits(t.qdata))
    _assert_every_backend(q, t.dequantize())

    checkpoints.save_checkpoint(tmp_path / "again", loaded, "torchao")
    from safetensors import safe_open

    with safe_open(str(tmp_path / "again" / "model.safetensors"), "pt") as f:
        again_metadata = f.metadata()
    rebuilt, leftover = unflatten_tensor_state_dict(_stored(tmp_path / "again"), again_metadata)
    assert not leftover
    np.testing.assert_array_equal(_bits(rebuilt["fc.weight"].dequantize()), _bits(t.dequantize()))


_TORCHAO_GRANULARITIES = {
    "PerTensor": ((), lowp.TensorScaling()),
    "PerRow": ((), lowp.AxisScaling(axis=-1)),
    "PerGroup": ((32,), lowp.GroupScaling(block=32)),
    "PerBlock": (((128, 128),), lowp.BlockScaling(block=(128, 128))),
}


@pytest.mark.parametrize("granularity", sorted(_TORCHAO_GRANULARITIES))
@pytest.mark.parametrize("hp", ["bfloat16", "float32"])
def test_quantize_like_torchao_gives_float8tensor_bytes(tmp_path, granularity, hp):
    pytest.importorskip("torchao")
    from torchao.quantization import granularity as granularities
    from torchao.quantization.quantize_.workflows.float8.float8_tensor import Float8Tensor

    args, scheme = _TORCHAO_GRANULARITIES[granularity]
    w = _weights((256, 384), seed=18, dtype=getattr(torch, hp))
    t = Float8Tensor.from_hp(w, granularity=getattr(granularities, granularity)(*args))
    q = checkpoints.quantize_like(_numpy(w), scheme, "torchao")
    np.testing.assert_array_equal(q.codes, _bits(t.qdata))
    np.testing.assert_array_equal(q.scale.reshape(-1), t.scale.numpy().reshape(-1))
    # lowp's own rule is not torchao's: the scale rounds to hp first (bf16), or multiplies
    # by a reciprocal where torchao divides (float32)
    mine = lowp.quantize(_numpy(w), scheme)
    assert not (np.array_equal(mine.codes, q.codes) and np.array_equal(mine.scale, q.scale))


def test_lowp_quantized_weights_written_as_torchao_load_in_torchao(tmp_path):
    pytest.importorskip("torchao")
    from safetensors import safe_open
    from torchao.prototype.safetensors.safetensors_support import unflatten_tensor_state_dict

    w = _numpy(_weights((256, 384), seed=19, dtype=torch.float32))
    tensors = {
        f"fc{i}.weight": lowp.quantize(w, scheme)
        for i, (_, scheme) in enumerate(_TORCHAO_GRANULARITIES.values())
    }
    checkpoints.save_checkpoint(tmp_path / "ao", tensors, "torchao")
    with safe_open(str(tmp_path / "ao" / "model.safetensors"), "pt") as f:
        metadata = f.metadata()
    rebuilt, leftover = unflatten_tensor_state_dict(_stored(tmp_path / "ao"), metadata)
    assert not leftover and sorted(rebuilt) == sorted(tensors)
    for name, q in tensors.items():
        np.testing.assert_array_equal(rebuilt[name].dequantize().numpy(), lowp.dequantize(q))


# --- A transformers model, quantized with lowp_torch, exported to each dialect ---

_EXPORTS = [
    ("float8_block", "hf-fp8"),
    ("float8_block", "compressed-tensors"),
    ("float8_block", "torchao"),
    ("float8_rowwise", "compressed-tensors"),
    ("float8_rowwise", "modelopt"),
    ("float8_rowwise", "torchao"),
    ("nvfp4", "compressed-tensors"),
    ("nvfp4", "modelopt"),
    ("mxfp4", "gpt-oss"),
]


@pytest.mark.slow  # loads and quantizes all-MiniLM-L6-v2's BERT
@pytest.mark.parametrize(("preset", "dialect"), _EXPORTS)
def test_minilm_bert_quantized_with_quantize_exports_to_each_dialect(tmp_path, preset, dialect):
    transformers = pytest.importorskip("transformers")
    import lowp_torch
    from lowp_apps import minilm

    if not minilm.available():
        pytest.skip("all-MiniLM-L6-v2 is not installed")
    model = transformers.AutoModel.from_pretrained(str(minilm.model_dir()), dtype=torch.float32)
    lowp_torch.quantize_(model, preset)
    tensors = {
        name: lowp_torch.to_lowp(t) if isinstance(t, lowp_torch.QuantizedTensor) else _numpy(t)
        for name, t in model.state_dict().items()
    }
    quantized = [n for n, v in tensors.items() if isinstance(v, lowp.QTensor)]
    assert len(quantized) == 37  # 6 layers x (q, k, v, attention out, intermediate, out), pooler
    checkpoints.save_checkpoint(tmp_path / dialect, tensors, dialect, config={"model_type": "bert"})

    loaded = lowp.load(tmp_path / dialect)
    assert sorted(loaded) == sorted(tensors)
    for name in quantized:
        ours, theirs = tensors[name], loaded[name]
        # an MX file holds no scale rule: the loaded scheme says the default, "floor"
        expected = (
            ours.scheme
            if ours.scheme.family != "mx"
            else dataclasses.replace(ours.scheme, mode="floor")
        )
        assert theirs.origin.dialect == dialect and theirs.scheme == expected, name
        np.testing.assert_array_equal(theirs.codes, ours.codes, err_msg=name)
        np.testing.assert_array_equal(theirs.scale, ours.scale, err_msg=name)
        if ours.scheme.family == "float":  # every producer's float8 product is lowp's here
            np.testing.assert_array_equal(
                lowp.dequantize(theirs, "float32"), lowp.dequantize(ours), err_msg=name
            )


def test_a_checkpoint_tensor_is_not_stripped_of_its_producer_rule_silently(tmp_path):
    """Saving it, or moving it to a frontend, would drop `origin` and with it the
    producer's values: refused, naming both ways out."""
    import lowp_torch

    w = _numpy(_weights((32, 64), seed=8, dtype=torch.float32))
    checkpoints.save_checkpoint(
        tmp_path / "mo", {"fc.weight": lowp.quantize(w, lowp.NVFP4Scaling())}, "modelopt"
    )
    q = lowp.load(tmp_path / "mo")["fc.weight"]
    assert q.origin is not None
    ways_out = r"modelopt checkpoint.*dataclasses.replace\(q, origin=None\).*or {}"
    with pytest.raises(
        ValueError, match="save: tensor 'w': .*" + ways_out.format(r"lowp.dequantize")
    ):
        lowp.save(tmp_path / "x.safetensors", {"w": q})
    with pytest.raises(ValueError, match=ways_out.format("lowp_torch.dequantize_checkpoint")):
        lowp_torch.from_lowp(q)
    plain = dataclasses.replace(q, origin=None)
    lowp.save(tmp_path / "x.safetensors", {"w": plain})
    np.testing.assert_array_equal(lowp.load(tmp_path / "x.safetensors")["w"].codes, q.codes)
    assert lowp_torch.from_lowp(plain).shape == q.shape

    pytest.importorskip("jax")
    import lowp_jax

    with pytest.raises(ValueError, match=ways_out.format("lowp_jax.dequantize_checkpoint")):
        lowp_jax.from_lowp(q)
    assert lowp_jax.from_lowp(plain).shape == q.shape
