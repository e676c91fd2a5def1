"""`lowp_torch.Linear` and `convert_to_training`: nn.Linear layers trained with a recipe."""

import torch
import torch.nn.functional as F
from torch import nn

import lowp
from lowp import extend
from lowp_torch import _log, _qtensor, _training

_DECISIONS_KEPT = 1024  # input shapes a layer remembers its small-shape decision for


class Linear(nn.Linear):
    """An nn.Linear whose forward, dgrad and wgrad GEMMs run as a `lowp.Recipe` says.

    Its parameters are nn.Linear's, in their own dtype: weight (out_features,
    in_features), bias (out_features,); its state_dict is nn.Linear's, with no
    buffers, because current scaling derives every scale from the tensor it scales at
    each call. So a checkpoint of a converted model is a checkpoint of the float model,
    and resuming one is exact.

    The output has the input's dtype (autocast's dtype under autocast). Inputs are
    (..., in_features); leading dims flatten into the M tokens of the GEMMs.

    Float32 weight-gradient accumulation (`recipe.fp32_weight_grad_accumulation`):
    the wgrad GEMM writes float32 and each backward adds it into `weight.main_grad`, a
    float32 tensor shaped like the weight (the name Transformer Engine and Megatron
    use), instead of `weight.grad`, which stays None. Summing micro-batches there
    rounds once at the end instead of once per micro-batch in a bfloat16 weight's
    dtype. The training loop hands it to the optimizer and zeroes it::

        for batch in micro_batches:
            loss_fn(model(batch)).backward()
        for p in model.parameters():
            if hasattr(p, "main_grad"):
                p.grad = p.main_grad.to(p.dtype)  # or step float32 master weights with it
                p.main_grad.zero_()
        optimizer.step(); optimizer.zero_grad()

    Args:
      in_features, out_features, bias, device, dtype: as nn.Linear.
      recipe: a `lowp.Recipe` or its name ("float8_rowwise", "mxfp8", ...).
      kernel: "auto" (the fastest GEMM the device allows, else emulated), "scaled_mm"
        (torch._scaled_mm, refused with the reason where it cannot run) or "emulated".
      pad_to_16: zero-pad K, N and the token count M to multiples of 16 for the fp8
        kernels (exact). Without it, kernel="scaled_mm" refuses a layer or an input
        whose dims are not, naming it, and "auto" emulates such a GEMM with a warning.
      name: the layer, for errors and logs (`convert_to_training` sets its path).
      small_shapes: "auto" (the default) runs a call in high precision, as the float
        layer would, where the fp8 GEMM kernels would run it but it is too small for
        them to pay for the casts (`lowp._small_shapes`: the predicted times of both,
        decided per call from the tokens M, under torch.compile from device time
        alone; a layer too small to pay at any expected token count says so when
        built). Only where fp8 kernels run (float8 on CUDA sm_89+): emulated
        GEMMs always run the recipe. "quantize" always runs the recipe.

    >>> import torch, lowp_torch
    >>> layer = lowp_torch.Linear(64, 32, recipe="float8_rowwise")
    >>> y = layer(torch.randn(2, 8, 64, requires_grad=True))
    >>> y.sum().backward()
    >>> y.shape, layer.weight.grad.shape
    (torch.Size([2, 8, 32]), torch.Size([32, 64]))
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device=None,
        dtype=None,
        *,
        recipe: "lowp.Recipe | str",
        kernel: str = "auto",
        pad_to_16: bool = False,
        name: str = "linear",
        small_shapes: str = "auto",
    ):
        super().__init__(in_features, out_features, bias, device, dtype)
        self.recipe = lowp.Recipe.of(recipe)
        self.plan = extend.LinearPlan.of(self.recipe)  # what each GEMM runs: `_training`
        self.lowering = _training.Lowering(kernel, pad_to_16, name, small_shapes)
        _training.check_layer(self.plan, in_features, out_features, self.lowering)
        if small_shapes == "auto" and not extend.layer_may_pay(
            in_features, out_features, self.recipe.name
        ):
            _log.info_once(
                f"{name} small shapes layer",
                f"{name}: where fp8 GEMM kernels run, it trains in high precision "
                f"({extend.describe_small_shape(None, in_features, out_features, self.recipe.name)}); "
                "small_shapes='quantize' forces fp8",
            )
        self._decided: dict[tuple[torch.Size, torch.device], str] = {}  # see _decide
        self._attach_main_grad()

    @classmethod
    def from_float(
        cls,
        linear: nn.Linear,
        recipe: "lowp.Recipe | str",
        *,
        kernel: str = "auto",
        pad_to_16: bool = False,
        name: str = "linear",
        small_shapes: str = "auto",
    ) -> "Linear":
        """A Linear sharing `linear`'s weight and bias Parameters (no copy), so an
        optimizer built on the float model keeps updating them."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"{name}: from_float takes an nn.Linear, got {type(linear).__name__}")
        if isinstance(linear.weight, _qtensor.QuantizedTensor):
            raise TypeError(
                f"{name}: the weight is quantized for inference (quantize_); train the float model"
            )
        with torch.device("meta"):  # no throwaway initialisation
            new = cls(
                linear.in_features,
                linear.out_features,
                bias=False,
                recipe=recipe,
                kernel=kernel,
                pad_to_16=pad_to_16,
                name=name,
                small_shapes=small_shapes,
            )
        new.weight, new.bias = linear.weight, linear.bias
        new._attach_main_grad()
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`x @ weight.T + bias` for `x` (..., in_features), the recipe's forward GEMM
        quantized (and its dgrad and wgrad in the backward), or the float layer's call
        where `small_shapes="auto"` keeps this call in high precision."""
        if type(self.weight).__name__ == "DTensor":  # tensor parallel: `_tensor_parallel`
            from lowp_torch import _tensor_parallel

            return _tensor_parallel.forward(self, x)
        if torch.compiler.is_compiling():  # traced once: the policy is asked directly
            self._check_input(x)
            return self._run(
                x, _training.in_high_precision(x, self.weight, self.recipe, self.lowering)
            )
        fallback = self._decided.get((x.shape, x.device))
        if fallback is None:
            fallback = self._decide(x)
        if fallback and not self.recipe.fp32_weight_grad_accumulation:
            weight, bias = self._weight_and_bias()
            if weight.dtype == x.dtype and not torch.is_autocast_enabled(fallback):
                return F.linear(x, weight, bias)  # the float layer's own call
        return self._run(x, bool(fallback))

    def _run(self, x: torch.Tensor, high_precision: bool) -> torch.Tensor:
        main_grad = None
        if self.recipe.fp32_weight_grad_accumulation:
            self._attach_main_grad()  # a deepcopy'd Parameter has lost its attributes
            main_grad = self.weight.main_grad
        if high_precision:
            return _training.high_precision_linear(
                x, self.weight, self.bias, main_grad, x.device.type
            )
        return _training.quantized_linear(
            x, self.weight, self.bias, self.plan, self.lowering, main_grad
        )

    def _check_input(self, x: torch.Tensor) -> None:
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise ValueError(
                f"{self.lowering.name}: the input's last dim must be in_features="
                f"{self.in_features}, got shape {tuple(x.shape)}"
            )

    def _decide(self, x: torch.Tensor) -> str:
        """Check `x`, ask the small-shape policy (`_training.in_high_precision`) and
        remember its answer for x's shape and device, which is all it depends on for this
        layer, so that the next call of that shape pays a dict lookup for it: x's device
        type ("cuda") where the call falls back to high precision, the one autocast is
        asked about then (`x.device.type` took 0.2 us a call on this 2-core CPU), and ""
        where it runs the recipe. Where the policy falls back, the step is launch-bound
        and its host time is the step's time, so the policy's Python must not run again
        each call (measured: docs/performance.md, "Small shapes")."""
        self._check_input(x)
        if len(self._decided) >= _DECISIONS_KEPT:  # a model fed ever new shapes
            self._decided.clear()
        high = _training.in_high_precision(x, self.weight, self.recipe, self.lowering)
        fallback = x.device.type if high else ""
        self._decided[(x.shape, x.device)] = fallback
        return fallback

    def _weight_and_bias(self) -> tuple:
        """self.weight and self.bias, read from the module's `_parameters` where they are
        registered there: nn.Module finds a parameter attribute through its __getattr__,
        ~0.4 us a lookup on this 2-core CPU, which nn.Linear's forward pays twice and the
        launch-bound fallback step pays on its clock. A parametrized weight or bias
        (torch.nn.utils.parametrize) is a property, not in `_parameters`: read as one."""
        params = self._parameters  # not params.get(name, self.name): that looks it up anyway
        weight = params["weight"] if "weight" in params else self.weight  # noqa: SIM401
        bias = params["bias"] if "bias" in params else self.bias  # noqa: SIM401
        return weight, bias

    def extra_repr(self) -> str:
        """nn.Linear's, with the recipe and kernel (and small_shapes when not "auto")."""
        return (
            f"{super().extra_repr()}, recipe={self.recipe.name!r}, kernel={self.lowering.kernel!r}"
            + ("" if self.lowering.small_shapes == "auto" else ", small_shapes='quantize'")
        )

    def _attach_main_grad(self) -> None:
        """Give the weight a zero float32 `main_grad` if the recipe asks for one and it
        has none (a meta-device weight gets one when it is materialised)."""
        weight = self.weight
        needed = self.recipe.fp32_weight_grad_accumulation and weight.device.type != "meta"
        if needed and getattr(weight, "main_grad", None) is None:
            weight.main_grad = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)

    def _apply(self, fn, recurse=True):
        # model.to(device) moves the weight; main_grad, a plain attribute, follows it
        # here, and stays float32 through model.to(torch.bfloat16).
        main_grad = getattr(self.weight, "main_grad", None)
        super()._apply(fn, recurse)
        if main_grad is not None:
            self.weight.main_grad = main_grad.to(self.weight.device)
        self._attach_main_grad()
        return self


def small_shapes_report(model: nn.Module, tokens: int, *, compiled: bool = False) -> str:
    """A table of what each training `Linear` of `model` runs at `tokens` tokens a call
    (x's leading dims flattened), in eager calls or under torch.compile (`compiled`):
    fp8 or high precision, and the small-shape policy's predicted times of both
    (`lowp._small_shapes`; a compiled call by its device time alone). It is what a
    device with the recipe's fp8 GEMM kernels does (float8 on CUDA sm_89+, MX and NVFP4
    on sm_100+); elsewhere the recipe always runs. Eager calls log the same decisions
    once per layer; compiled ones log nothing, so this is where to see them.

    Raises:
      ValueError: tokens is not a positive int, or `model` has no `lowp_torch.Linear`
        (`convert_to_training` makes them).

    >>> import torch, lowp_torch
    >>> model = lowp_torch.convert_to_training(torch.nn.Linear(4096, 4096), "float8_rowwise")
    >>> print(lowp_torch.small_shapes_report(model, 8192, compiled=True))
    small_shapes at 8192 tokens a call, compiled (device time), where fp8 GEMM kernels run:
    layer        K -> N        recipe          fp8 ms  high-precision ms  runs
    (the model)  4096 -> 4096  float8_rowwise   0.787              1.178  fp8
    """
    layers = [
        (name or "(the model)", m) for name, m in model.named_modules() if isinstance(m, Linear)
    ]
    if not layers:
        raise ValueError(
            f"{type(model).__name__} has no lowp_torch.Linear: convert_to_training makes them"
        )
    rows = [
        (name, m.in_features, m.out_features, m.recipe.name, m.lowering.small_shapes == "quantize")
        for name, m in layers
    ]
    return extend.small_shapes_table(rows, tokens, traced=compiled, traced_as="compiled")


def convert_to_training(
    model: nn.Module,
    recipe: "lowp.Recipe | str",
    filter_fn=None,
    *,
    kernel: str = "auto",
    pad_to_16: bool = False,
    small_shapes: str = "auto",
) -> nn.Module:
    """Swap each `nn.Linear` of `model` for a `lowp_torch.Linear` training with `recipe`.

    The new layers share the old ones' Parameters, so an optimizer already built on
    the model keeps working, and the state_dict is unchanged. Swapping happens only
    once every layer has been checked: an error leaves the model as it was.

    Args:
      model: any module; an nn.Linear reachable twice is converted once.
      recipe: a `lowp.Recipe` or its name (`lowp.Recipe.names()`).
      filter_fn: `filter_fn(module, name) -> bool`; only linears it accepts convert
        (name is the module's path, "layers.0.mlp.fc1").
      kernel, pad_to_16, small_shapes: see `lowp_torch.Linear`.

    Returns:
      `model`, converted in place; if `model` itself is an nn.Linear, the new Linear.

    Raises:
      ValueError: naming the layer, for an in_features/out_features the recipe's
        schemes cannot quantize (an MX block must divide both) or an explicit fp8
        kernel cannot take. Nothing is skipped silently: exclude it with filter_fn.
      TypeError: `recipe` is not a recipe (an inference config goes to `quantize_`),
        or a layer is already converted or quantized.

    >>> import torch, lowp_torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.GELU())
    >>> model = lowp_torch.convert_to_training(model, "mxfp8")
    >>> model[0]
    Linear(in_features=64, out_features=32, bias=True, recipe='mxfp8', kernel='auto')
    """
    recipe = lowp.Recipe.of(recipe)
    if filter_fn is not None and not callable(filter_fn):
        raise TypeError(f"filter_fn must be callable(module, name) -> bool, got {filter_fn!r}")

    def convert(module, name):
        if isinstance(module, Linear):
            raise TypeError(
                f"convert_to_training: {name or 'the model'} is already a lowp_torch.Linear"
            )
        return Linear.from_float(
            module,
            recipe,
            kernel=kernel,
            pad_to_16=pad_to_16,
            name=name or "linear",
            small_shapes=small_shapes,
        )

    if isinstance(model, nn.Linear):
        return convert(model, "") if filter_fn is None or filter_fn(model, "") else model
    new = {}  # id(old linear) -> its Linear; checked before any swap
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and (filter_fn is None or filter_fn(module, name)):
            new[id(module)] = convert(module, name)
    swap_children(model, new)
    return model


def swap_children(model: nn.Module, new: dict) -> None:
    """Replace every child `c` of every submodule with `new[id(c)]` where present."""
    for module in list(model.modules()):
        # `_modules`, not named_children(), which yields a child held twice only once.
        for child_name, child in list(module._modules.items()):
            if id(child) in new:
                setattr(module, child_name, new[id(child)])
