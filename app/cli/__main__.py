"""``python -m app.cli`` == the ``mpc3`` command."""
import sys

from . import main

sys.exit(main())
