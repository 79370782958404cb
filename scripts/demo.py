"""The laptop demo, now the command ``specwatch demo`` (service/demo, shipped in the package): this alias runs it.

    python scripts/demo.py --url http://127.0.0.1:8000 --secret "$SECRET" --token "$TOKEN"
    specwatch demo --url http://127.0.0.1:8000 --secret "$SECRET" --token "$TOKEN"      # the same
"""

from __future__ import annotations

import sys

from service.cli import app

if __name__ == "__main__":
    sys.exit(app(["demo", *sys.argv[1:]]))
