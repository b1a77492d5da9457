"""The package version, in a module of its own so that any module can read it without importing
the package ``__init__`` (imports run one way: from the top down).  pyproject.toml repeats it;
tests/unit/test_public_names.py keeps the two equal."""
__version__ = "0.1.0"
