"""The push step."""
