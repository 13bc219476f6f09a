"""Backend implementations, one folder each."""
