"""Real models written with flax nnx, loaded from checkpoints the core reads."""
