"""all-MiniLM-L6-v2 in PyTorch (`torch_minilm`) and flax nnx (`jax_minilm`)."""
