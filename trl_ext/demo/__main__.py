"""`python -m trl_ext.demo [--flag value ...]`: run the embedded default."""

import sys

from trl_ext.demo.run import main

sys.exit(main() and 0)
