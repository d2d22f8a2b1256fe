"""``python -m seeupo``: the command line (also what ``torchrun -m seeupo train ...`` runs)."""

import sys

try:
    from seeupo.cli import console
except KeyboardInterrupt:  # Ctrl-C in the first instant, before the command line could report it
    print("seeupo: interrupted", file=sys.stderr)
    sys.exit(130)

console()
