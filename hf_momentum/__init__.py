"""HuggingFace transformers integration of momentum-plugins (filled by issue #4)."""
