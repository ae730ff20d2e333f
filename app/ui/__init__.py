"""Qt widgets and item models."""
