"""qbackend's version (also in setup.py), written into saved files and tune-cache fingerprints."""
VERSION = "0.1.0"
