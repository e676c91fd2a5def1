"""A quantized Hugging Face transformers model to a directory and back, bytes unchanged.

`model.save_pretrained(dir)` cannot write a `quantize_`'d model: safetensors writes one
plain storage per tensor, and a QuantizedTensor is codes, scales and a scheme (its
`storage()` raises, naming these functions). lowp's own file holds all three, so:

    lowp_torch.save_pretrained(model, dir)
        # dir/config.json (the model's config, by transformers) and
        # dir/lowp_model.safetensors (every tensor of the state dict, lowp's interchange
        # file: `save_quantized`)
    model = lowp_torch.from_pretrained(transformers.AutoModel, dir)
        # the architecture from config.json (`from_config`), then `load_quantized`:
        # the same codes and scales, each layer's activation scheme as saved

transformers is imported by the caller, never here: lowp_torch does not depend on it.
"""

import pathlib

from torch import nn

from lowp_torch import _model

WEIGHTS_NAME = "lowp_model.safetensors"


def save_pretrained(model: nn.Module, directory) -> pathlib.Path:
    """Write a (quantized) transformers model's config and tensors to `directory`.

    Args:
      model: a transformers `PreTrainedModel`, quantized with `quantize_` or not.
      directory: created if missing.

    Returns:
      The path of the tensors file, `directory / "lowp_model.safetensors"`.
    """
    if not hasattr(model, "config") or not hasattr(model.config, "save_pretrained"):
        raise TypeError(
            f"save_pretrained takes a transformers PreTrainedModel (one with a .config), got "
            f"{type(model).__name__}; for any other module use lowp_torch.save_quantized"
        )
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(directory)
    path = directory / WEIGHTS_NAME
    _model.save_quantized(model, path)
    return path


def from_pretrained(model_class, directory, **load_options) -> nn.Module:
    """The model `save_pretrained` wrote to `directory`, quantized as it was saved.

    Args:
      model_class: a transformers class with `from_config` (`transformers.AutoModel`,
        `BertModel`, `AutoModelForCausalLM`, ...).
      directory: what `save_pretrained` wrote.
      load_options: passed to `load_quantized` (kernel, pad_to_16, fast_accum, strict).

    Returns:
      The model in eval mode, every tensor the saved one.
    """
    import transformers  # the caller's: only this function needs it

    directory = pathlib.Path(directory)
    path = directory / WEIGHTS_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"from_pretrained: {path} is missing; write the directory with "
            "lowp_torch.save_pretrained(model, directory)"
        )
    config = transformers.AutoConfig.from_pretrained(directory)
    model = model_class.from_config(config)
    _model.load_quantized(model, path, **load_options)
    return model.eval()
