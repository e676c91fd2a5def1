"""lowp_apps: the applications built on lowp and its frontends.

The `lowp` command line (`cli`: demo, formats, inspect, conformance), the demo
(`demo`, `demo_frameworks`, `demo_report`), checkpoint inspection (`inspection`: the
numbers; `inspection_report`: their text, JSON and plot), the conformance harness
(`conformance`), and the all-MiniLM-L6-v2 model in NumPy (`minilm`), PyTorch
(`models.torch_minilm`) and flax (`models.jax_minilm`).

This package may import everything; `lowp`, `lowp_torch` and `lowp_jax` never import it
(docs/architecture.md).
"""
