"""Bad input to the core's public functions is refused with a message naming it (issue 23)."""

import re

import numpy as np
import pytest

import lowp

E4M3 = lowp.FORMATS["float8_e4m3fn"]


@pytest.mark.parametrize(
    "codes", [np.array([300]), np.array([-1]), np.array([1.7]), np.array([1], np.uint16)]
)
def test_decode_refuses_codes_that_are_not_uint8(codes):
    # np.asarray(codes, uint8) wrapped these: 300 -> 44 (0.375), -1 -> 255 (NaN), 1.7 -> 1.
    with pytest.raises(TypeError, match=f"uint8.*{codes.dtype}"):
        lowp.decode(codes, E4M3)


def test_unpack_fp4_refuses_packed_codes_that_are_not_uint8():
    # A 0x1FF int unpacked to the nibbles 15 and 31; 31 is no fp4 code.
    with pytest.raises(TypeError, match="uint8.*int64"):
        lowp.unpack_fp4(np.array([0x1FF]))


@pytest.mark.parametrize("function", [lowp.encode, lowp.decode])
def test_encode_and_decode_name_a_format_given_as_a_string(function):
    # The format by name reached `fmt.bits`: AttributeError: 'str' object has no attribute.
    with pytest.raises(TypeError, match=r"lowp.FORMATS\['float8_e4m3fn'\]"):
        function(np.zeros(2, np.float32 if function is lowp.encode else np.uint8), "float8_e4m3fn")


@pytest.mark.parametrize("from_name", [lowp.Recipe.from_name, lowp.InferenceConfig.from_name])
@pytest.mark.parametrize("name", [["mxfp8"], {"mxfp8": 1}, None])
def test_from_name_names_a_value_that_is_no_name(from_name, name):
    # `name in _RECIPES` raised TypeError: unhashable type: 'list'.
    with pytest.raises(
        ValueError, match=r"unknown (recipe|inference preset) " + re.escape(repr(name))
    ):
        from_name(name)


def test_lowp_inspect_names_a_directory(tmp_path, capsys):
    # It said "no such file" of a folder that exists; a directory is read as a checkpoint
    # directory, and one without safetensors files is named as such.
    from lowp_apps import cli

    assert cli.main(["inspect", str(tmp_path), "--no-progress"]) == 2
    assert f"{tmp_path}: a directory with no " in capsys.readouterr().err


@pytest.mark.parametrize("dtype", [">f4", ">f2"])
def test_quantize_names_a_big_endian_array(dtype):
    # It said "input dtype >f4 is not float32, bfloat16 or float16": it is, byte-swapped.
    with pytest.raises(TypeError, match=rf"x: a big-endian array \({dtype}\)"):
        lowp.quantize(np.ones(4, dtype), lowp.TensorScaling(), name="x")


@pytest.mark.parametrize("layout", ["to_sparse", "to_sparse_csr"])
def test_torch_quantize_names_a_sparse_tensor(layout):
    # A COO tensor raised "reshape is not implemented for sparse tensors" (CSR: "do not
    # have is_contiguous"), neither naming the input.
    torch = pytest.importorskip("torch")
    import lowp_torch

    sparse = getattr(torch.ones(4, 32), layout)()
    with pytest.raises(TypeError, match=r"w: a torch\.sparse_\w+ tensor of shape \(4, 32\)"):
        lowp_torch.quantize(sparse, lowp.MXScaling(), name="w")
