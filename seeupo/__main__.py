"""``python -m seeupo``: the command line (also what ``torchrun -m seeupo train ...`` runs)."""

import sys

from seeupo.cli import console

sys.exit(console())
