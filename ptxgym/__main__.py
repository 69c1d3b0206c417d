"""``python -m ptxgym`` runs the command line."""

import sys

from ptxgym.cli import main

sys.exit(main())
