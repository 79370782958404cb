"""The laptop demo, now the command ``specwatch demo`` (service/demo, shipped in the package): this alias runs it,
``python scripts/demo.py --token "$TOKEN"`` being ``specwatch demo --token "$TOKEN"`` (docs/getting-started.md)."""

from __future__ import annotations

import sys

from service.cli import app

if __name__ == "__main__":
    sys.exit(app(["demo", *sys.argv[1:]]))
