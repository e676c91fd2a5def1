"""Cross-backend conformance: the same cases on every backend, compared byte for byte.

lowp's contract is that the NumPy reference, lowp_torch (CPU and CUDA, eager and
compiled) and lowp_jax (CPU and GPU) quantize to the same bytes. This package is that
contract as executable checks, shared by the test suite (tests/conformance/), the
frontends' GPU scripts and `lowp conformance`:

- `cases`: the configurations (scheme x format x rank x input dtype x rounding) and
  the edge-case inputs of spec §6;
- `compare`: the byte comparison and the description of the first difference;
- `backends`: numpy, torch_cpu, torch_cuda_eager, torch_cuda_compiled, jax_cpu,
  jax_gpu, each present where it can run (torch and jax are imported lazily);
- `run`: one case checked, or a plan run on a backend and counted per scheme kind;
- `report`: the matrix scheme kind x backend as text and JSON (`lowp conformance`);
- `gemm`: spec §7, every GEMM path of a backend against the float64 product of the
  reference's dequantized operands, for every preset and recipe GEMM.
"""
