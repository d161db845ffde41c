"""``python -m bench``: same as ``python bench/run.py``."""

import sys

from bench.run import main

sys.exit(main())
