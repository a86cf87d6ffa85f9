"""``python -m mptlml.lm_eval ...``: lm-eval's command line with the ``mptlml`` model registered."""

import sys

from .command import run

sys.exit(run())
