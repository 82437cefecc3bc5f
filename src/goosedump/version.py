"""The engine version (pyproject.toml says the same; a test checks)."""
__version__ = "0.1.0"
