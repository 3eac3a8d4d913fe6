"""CLI layer: the capsim command."""
