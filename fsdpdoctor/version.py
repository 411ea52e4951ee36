"""The package's version, on the ground floor: the capture (written into every manifest) and the CLI
read it without importing the notebook facade (``fsdpdoctor/__init__.py``) that sits on top."""

__version__ = "0.1.0"
