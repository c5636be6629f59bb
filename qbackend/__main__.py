"""`python -m qbackend ...` runs the command line (qbackend.cli)."""
import sys

from .cli import main

sys.exit(main())
