"""The package's version, its one home: pyproject.toml reads it (tool.setuptools.dynamic) and so
does python/build_wheel.py (`make wheel`)."""

__version__ = "0.2.0"
