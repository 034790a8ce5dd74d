"""The tokenize step."""
