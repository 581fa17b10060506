"""The package version: apart from the package init, which imports the Python API, so that a
module reading the version does not import the API with it."""

__version__ = "0.1.0"
