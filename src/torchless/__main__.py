"""``python -m torchless``."""

from __future__ import annotations

import sys

from torchless.core.collector import importing, own_process

own_process()
with importing():
    from torchless.cli.main import main

sys.exit(main())
