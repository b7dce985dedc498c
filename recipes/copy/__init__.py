"""Copy task for causal transformers (momentum_transformer.md Section 4.1, Figure 1)."""
