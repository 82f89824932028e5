"""python -m dra: the dra-gpu command line."""

import sys

from dra.cli import main

sys.exit(main())
