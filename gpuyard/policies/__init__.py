"""Built-in policies. Each is registered by an entry point in pyproject.toml, like a third party's."""
