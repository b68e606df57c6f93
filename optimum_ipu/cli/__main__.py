"""`python -m optimum_ipu.cli ...`: the `optimum-ipu` command."""

import sys

from .main import main

sys.exit(main())
