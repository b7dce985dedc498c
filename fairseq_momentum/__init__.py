"""fairseq user-dir of momentum-plugins (filled by issue #5)."""
