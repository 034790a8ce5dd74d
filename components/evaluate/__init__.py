"""The evaluate step."""
