from __future__ import annotations

import sys

from comfyveil.cli import main

sys.exit(main())
