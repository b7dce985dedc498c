"""End-to-end experiments reproducing the papers (see each recipe's README)."""
