"""Model families: K2-style and K3-style decoders, their blocks, accounting and presets."""
