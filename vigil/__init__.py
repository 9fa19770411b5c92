"""Vigil's command line and local stack: the only package that wires stages together."""

__version__ = "0.1.0"
