"""A toy target library in a real git repository: a speculative sampler written with torch, src layout.

Its sampler is ``toy_lib.sampler:speculative_sample`` (the target's ``adapter``). Variants of the sampler
source make the commits the worker tests need: correct, buggy (swapped residual), broken (import error),
slow (sleeps past any limit) and one that records its environment.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

ADAPTER = "toy_lib.sampler:speculative_sample"

# The toy library's correct sampler, shared with `specwatch demo` (service/demo).
CORRECT = (Path(__file__).resolve().parents[2] / "service" / "demo" / "toy_sampler.py.txt").read_text()

# The classic bug: the residual (p - q)+ written as (q - p)+.
SWAPPED_RESIDUAL = CORRECT.replace("return (p - q).clamp(min=0)", "return (q - p).clamp(min=0)")
assert SWAPPED_RESIDUAL != CORRECT

BROKEN_IMPORT = CORRECT.replace("import torch\n", "import torch\nfrom torch import no_such_name_in_torch\n", 1)

SLOW = CORRECT.replace(
    "    p, q = step.target_probs, step.draft_probs\n",
    "    import time\n\n    time.sleep(3600)\n    p, q = step.target_probs, step.draft_probs\n",
)


def env_dump(path: Path) -> str:
    """The correct sampler, which first writes its process environment and cwd to ``path`` (JSON)."""
    return CORRECT.replace(
        "import torch\n",
        f"import json\nimport os\n\nimport torch\n\njson.dump({{'env': dict(os.environ), 'cwd': os.getcwd()}}, open({str(path)!r}, 'w'))\n",
        1,
    )


def git(repo: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "Toy",
        "GIT_AUTHOR_EMAIL": "toy@example.com",
        "GIT_COMMITTER_NAME": "Toy",
        "GIT_COMMITTER_EMAIL": "toy@example.com",
    }
    done = subprocess.run(["git", *args], cwd=repo, env={**os.environ, **env}, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@dataclass(frozen=True)
class ToyRepo:
    path: Path

    @property
    def url(self) -> str:
        return str(self.path)

    @classmethod
    def create(cls, path: Path) -> ToyRepo:
        path.mkdir(parents=True)
        git(path, "init", "--quiet", "--initial-branch", "main")
        (path / "src" / "toy_lib").mkdir(parents=True)
        (path / "src" / "toy_lib" / "__init__.py").write_text('"""A toy speculative-decoding library."""\n')
        (path / "README.md").write_text("toy_lib\n")
        return cls(path)

    def commit(self, sampler_source: str, message: str) -> str:
        """Commit ``sampler_source`` as ``src/toy_lib/sampler.py`` on main; the new commit's sha."""
        (self.path / "src" / "toy_lib" / "sampler.py").write_text(sampler_source)
        git(self.path, "add", "--all")
        git(self.path, "commit", "--quiet", "--allow-empty", "-m", message)
        return git(self.path, "rev-parse", "HEAD")

    def history(self) -> tuple[str, str, str]:
        """The story of the e2e tests: correct, then the swapped-residual bug, then the fix."""
        good = self.commit(CORRECT, "Add speculative sampling")
        bad = self.commit(SWAPPED_RESIDUAL, "Simplify the residual")
        fixed = self.commit(CORRECT, "Fix the residual: (p - q)+, not (q - p)+")
        return good, bad, fixed
