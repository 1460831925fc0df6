"""The package's version, in one place: ``pyproject.toml`` reads it from
here (``[tool.setuptools.dynamic]``) and ``charon_client.__version__`` is
this."""

__version__ = "0.2.0"
