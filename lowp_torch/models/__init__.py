"""Real models written with torch.nn, loaded from checkpoints the core reads."""
