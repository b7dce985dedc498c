"""Autoregressive image generation (Momentum Transformer, §4.2): the mixture-of-logistics
likelihood and sampler, pixel-sequence data, sample grids."""
