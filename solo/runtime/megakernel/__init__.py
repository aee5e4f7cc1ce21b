"""The monokernel (placeholder docstring, rewritten below)."""
