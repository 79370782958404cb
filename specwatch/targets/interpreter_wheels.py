"""Metadata-only wheels of the interpreter's torch, numpy and scipy: what a release's install resolves against.

A release folder never holds its own torch, numpy or scipy: the interpreter's stay in force (a constraints file pins
them to its versions, and the folder's copies are removed after the install). pip still resolves the release's
requirements against those pins, and with ``--target`` it fetches each pinned version from the index. A worker's
torch is often a build the index does not serve (``2.13.0+cpu``, ``2.13.0+cu130``): pip then finds no candidate,
backtracks through the release's dependency history for minutes and fails. So each pinned package is given to pip as a
wheel file of its own name and exact version holding only its metadata (no code, no requirements of its own): pip
takes the file as that requirement without asking the index, which also spares downloading torch into every folder.

Hypothesis: the interpreter's own copies satisfy whatever the release needs of them (the constraints say the same).
Guarantee: the stub's name and version are the interpreter's, so a release whose metadata rejects them fails to
resolve exactly as with the real wheels; nothing of the stub is ever imported (the folder's copy is removed).
"""

from __future__ import annotations

import base64
import hashlib
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path

#: The folder of a release's cache entry the stubs are written to, removed after the install.
STUB_FOLDER = ".interpreter-wheels"


def stub_wheels(pins: Mapping[str, str], folder: Path) -> list[Path]:
    """One metadata-only wheel per ``name: version`` of ``pins`` in ``folder`` (created), sorted by name."""
    folder.mkdir(parents=True, exist_ok=True)
    return [stub_wheel(name, version, folder) for name, version in sorted(pins.items())]


def stub_wheel(name: str, version: str, folder: Path) -> Path:
    """``folder/<name>-<version>-py3-none-any.whl``: the ``.dist-info`` of ``name`` ``version`` and nothing else
    (METADATA, WHEEL and a RECORD with each file's digest, as the wheel format asks)."""
    project = re.sub(r"[-_.]+", "_", name)
    dist_info = f"{project}-{version}.dist-info"
    files = {
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        "Summary: the interpreter's own copy stands for this distribution (specwatch)\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: specwatch\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{path},sha256={_digest(text)},{len(text.encode())}\n" for path, text in files.items())
    files[f"{dist_info}/RECORD"] = record + f"{dist_info}/RECORD,,\n"
    path = folder / f"{project}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as wheel:
        for member, text in files.items():
            wheel.writestr(member, text)
    return path


def _digest(text: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
