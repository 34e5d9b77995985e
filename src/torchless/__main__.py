"""``python -m torchless``."""

from __future__ import annotations

import sys

from torchless.cli.main import main

sys.exit(main())
