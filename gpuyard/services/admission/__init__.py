"""The admission service."""
