"""The nodeagent service."""
