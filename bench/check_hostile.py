"""The hostile probe of issue 28, item 2, against ``specwatch check``: what a sampler under test reaches, and the cost.

A sampler module in a fresh project folder tries, at import: the ``SPECWATCH_*`` secret in its environment and in
any ``/proc/<pid>/environ``; a key in ``~/.ssh`` (a fake home holding one); ``/etc/shadow``; a TCP connection to
127.0.0.1:5432 (PostgreSQL) and 127.0.0.1:6379 (Redis); writing a file into the installed ``specwatch`` package.
It then raises with what it saw, so that the case's reason carries it. ``check`` runs once sandboxed (the default)
and once with ``--no-sandbox`` (the behaviour before). Printed per run: the isolation ``check`` reports, the wall
time, and what leaked::

    OMP_NUM_THREADS=1 .venv/bin/python bench/check_hostile.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

SECRET = "bench-hostile-secret"
SAMPLER = """
import json, os, socket, uuid
from pathlib import Path
import specwatch

def _seen():
    seen = {"env": any(SECRET in v for v in os.environ.values())}
    procs = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            procs += [pid] if SECRET.encode() in Path(f"/proc/{pid}/environ").read_bytes() else []
        except OSError:
            pass
    seen["proc_environ"] = len(procs)
    for name, path in (("ssh", KEY), ("shadow", "/etc/shadow")):
        try:
            seen[name] = len(Path(path).read_bytes())
        except OSError as exc:
            seen[name] = type(exc).__name__
    for name, port in (("postgres", 5432), ("redis", 6379)):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=3).close()
            seen[name] = "connected"
        except OSError as exc:
            seen[name] = type(exc).__name__
    target = Path(specwatch.__file__).parent / f"hostile-{uuid.uuid4().hex}"
    try:
        target.write_text("x")
        target.unlink()
        seen["package_write"] = "written"
    except OSError as exc:
        seen["package_write"] = type(exc).__name__
    return seen

SEEN = _seen()

def sample(step, n, generator):
    raise RuntimeError("PROBE " + json.dumps(SEEN))
"""


def main() -> None:
    specwatch_bin = str(Path(sys.executable).with_name("specwatch"))
    with tempfile.TemporaryDirectory(prefix="check-hostile-") as tmp:
        root = Path(tmp)
        home, project = root / "home", root / "project"
        (home / ".ssh").mkdir(parents=True)
        key = home / ".ssh" / "id_ed25519"
        key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n" + "A" * 400 + "\n")
        project.mkdir()
        body = SAMPLER.replace("SECRET", repr(SECRET)).replace("KEY", repr(str(key)))
        (project / "hostile_sampler.py").write_text(textwrap.dedent(body))
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPECWATCH_")}
        env |= {"HOME": str(home), "SPECWATCH_WEBHOOK_SECRET": SECRET, "PYTHONPATH": ""}
        for extra in ([], ["--no-sandbox"]):
            out = project / "run.json"
            argv = [specwatch_bin, "check", "--target", "hostile_sampler:sample", "--cases", "direct/far_apart/V8/g1", "--json", str(out)]
            started = time.monotonic()
            done = subprocess.run([*argv, *extra], cwd=project, env=env, capture_output=True, text=True, check=False)
            wall = time.monotonic() - started
            payload = json.loads(out.read_text())
            reason = payload["results"][0]["reason"]
            seen = json.loads(reason[reason.index("PROBE ") + 6 :].splitlines()[0])
            isolation = payload["isolation"]
            print(
                f"check {' '.join(extra) or '(default)'}: exit {done.returncode}, isolation {isolation['mode']}"
                f" ({isolation['reason'] or 'bubblewrap'}), {wall:.1f} s"
            )
            print(f"  reached: {json.dumps(seen)}")


if __name__ == "__main__":
    main()
