# A script that talks to its user and runs git and pip (pyproject gives scripts/ no per-file ignores yet):
# ruff: noqa: T201, S603, S607
"""A replay test bed: a git repository whose commits are the source trees of successive releases of a library.

    python scripts/replay_history.py transformers 4.37.2 4.40.2 4.41.2 --out /tmp/transformers-history
    python scripts/replay_history.py toy-lib 1.0 1.1 --out DIR --index-url http://127.0.0.1:8080/simple

Each release's source distribution is downloaded from the package index (``pip download --no-binary :all:
--no-deps``: the index pip is configured for, or ``--index-url``), unpacked, and laid out as the library's
repository: one commit per release on ``main``, in the order given, whose tree is exactly the distribution's
(files a release dropped are deleted), its message ``<name> <version>``, its author and committer dates the
release's upload order (a fixed day per release, so that the history is reproducible), tagged ``v<version>``.
A watched instance (``specwatch serve`` with the repository as a local target, ``--install source``) then sees a
real library's history commit by commit: push each commit (or let the branch poller find them) and compare its
alerts, first bad commits and fixes with what each release is known to do.

The last line printed is the JSON list of ``{"version", "sha"}``, oldest first. Exit 1 when a release has no
source distribution on the index (pip's reason printed).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

#: The day of the first release's commit; each later release one day after (git dates, UTC).
EPOCH = 1_700_000_000
DAY = 86_400


def download_sdist(name: str, version: str, dest: Path, index_url: str | None) -> Path:
    """The source distribution of ``name==version`` downloaded into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps", "--no-binary", ":all:"]
    cmd += [*(("--index-url", index_url) if index_url else ()), "-d", str(dest), f"{name}=={version}"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    found = [p for p in dest.iterdir() if p.suffix in (".gz", ".zip") or p.name.endswith(".tar.gz")]
    if done.returncode != 0 or not found:
        raise SystemExit(f"{name}=={version}: no source distribution could be downloaded: {(done.stderr or done.stdout).strip()[-500:]}")
    return found[0]


def unpack(sdist: Path, dest: Path) -> Path:
    """The distribution's single top folder, unpacked under ``dest``."""
    if sdist.name.endswith(".zip"):
        with zipfile.ZipFile(sdist) as archive:
            archive.extractall(dest)  # noqa: S202 - a distribution from the index, unpacked into a scratch folder
    else:
        with tarfile.open(sdist) as archive:
            archive.extractall(dest, filter="data")
    tops = [p for p in dest.iterdir() if p.is_dir()]
    if len(tops) != 1:
        raise SystemExit(f"{sdist.name}: expected one top folder, found {[p.name for p in tops]}")
    return tops[0]


def git(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    identity = ["-c", "user.name=specwatch replay", "-c", "user.email=replay@specwatch.invalid", "-c", "commit.gpgsign=false"]
    done = subprocess.run(["git", *identity, "-C", str(repo), *args], capture_output=True, text=True, check=True, env=env)
    return done.stdout.strip()


def lay_out(tree: Path, repo: Path) -> None:
    """Make ``repo``'s work tree exactly ``tree`` (its ``.git`` kept)."""
    for entry in repo.iterdir():
        if entry.name != ".git":
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    for entry in tree.iterdir():
        target = repo / entry.name
        shutil.copytree(entry, target, symlinks=True) if entry.is_dir() else shutil.copy2(entry, target)


def build(name: str, versions: list[str], out: Path, *, index_url: str | None = None) -> list[dict[str, str]]:
    """The repository ``out`` (created; it must not exist) with one commit per release; its commits, oldest first."""
    if out.exists():
        raise SystemExit(f"{out} exists: name a new folder")
    out.mkdir(parents=True)
    git(out, "init", "--quiet", "--initial-branch", "main")
    commits = []
    with tempfile.TemporaryDirectory(prefix="specwatch-replay-") as tmp:
        for i, version in enumerate(versions):
            work = Path(tmp) / version
            tree = unpack(download_sdist(name, version, work / "dist", index_url), work / "tree")
            lay_out(tree, out)
            # A new index from the files' contents: a distribution's files keep their archive times, so a file
            # changed at the same size would look unchanged to the old index's stat cache.
            (out / ".git" / "index").unlink(missing_ok=True)
            git(out, "add", "--all")
            date = f"@{EPOCH + i * DAY} +0000"
            env = {**os.environ, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
            git(out, "commit", "--quiet", "--allow-empty", "--message", f"{name} {version}", env=env)
            git(out, "tag", f"v{version}")
            commits.append({"version": version, "sha": git(out, "rev-parse", "HEAD")})
            print(f"{name} {version}: {commits[-1]['sha']}", file=sys.stderr)
    return commits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="the library's name on the package index")
    parser.add_argument("versions", nargs="+", help="its releases, oldest first")
    parser.add_argument("--out", type=Path, required=True, help="the repository to create (a new folder)")
    parser.add_argument("--index-url", help="the package index (default: pip's configuration)")
    args = parser.parse_args(argv)
    print(json.dumps(build(args.name, args.versions, args.out, index_url=args.index_url)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
