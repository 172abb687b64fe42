"""``python -m scaletrain`` = the ``scaletrain`` command."""

import sys

from scaletrain.cli import console

sys.exit(console())
