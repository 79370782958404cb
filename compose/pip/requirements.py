"""The images' requirement lists from pyproject.toml: `python requirements.py api|worker` prints one a line.

api: what the control plane needs (the server's dependencies), without the suite's torch, numpy and scipy.
worker: the server's dependencies and the suite's. Whichever layout pyproject.toml has: the server's
dependencies as the project's own with the suite as the `suite` extra, or the suite's as the project's own
with the server as the `server` extra.
"""

import re
import sys
import tomllib

SUITE_ONLY = {"torch", "numpy", "scipy"}

project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project.get("optional-dependencies", {})
everything = [*project["dependencies"], *extras.get("server", []), *extras.get("suite", [])]
if sys.argv[1] == "api":
    everything = [r for r in everything if re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0].lower() not in SUITE_ONLY]
print("\n".join(dict.fromkeys(everything)))
