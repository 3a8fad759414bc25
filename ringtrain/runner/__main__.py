"""Run ``ringtrain-run`` as ``python -m ringtrain.runner``."""

import sys

from ringtrain.runner.cli import main

sys.exit(main())
