"""Copy task for causal transformers (Momentum Transformer, Section 4.1, Figure 1)."""
