"""Helpers shared by the recipes: corpora, fairseq runs, plots."""
