"""`python -m vigil_gpu_monitor` is the `vigil` command."""

import sys

from vigil_gpu_monitor.vigil.cli import main

sys.exit(main())
