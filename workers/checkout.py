"""Target source trees: one bare mirror per repository, a detached worktree per run.

The mirror is cloned once (``git clone --mirror``) and fetched only when a requested commit is missing;
each run gets ``git worktree add --detach <dir> <sha>`` in its scratch directory, removed (and the mirror's
worktree list pruned) when the run ends, even when it fails. Mirror operations take an exclusive file lock,
so several worker processes on one machine share a mirror safely.

The branch poller asks the remote for its heads (:meth:`MirrorCache.ls_remote`) and the mirror for the history
between two heads (:meth:`MirrorCache.first_parent_log`, :meth:`MirrorCache.is_ancestor`).

Every git command runs with ``protocol.allow=never`` and only the protocols of the cache's
:class:`~service.targets.RepoPolicy` allowed (https by default; ``file`` only with local repositories
allowed), and a repository URL is checked against the policy again before anything is fetched (a target
stored before a stricter policy, a host that resolves to a private address). A failing git command is
summarised in one line (what failed and a cause among a few known ones); git's own stderr and command line,
which may name paths that exist on the worker, only go to the worker's log.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit

from service.addresses import ip_of, is_private_address, is_private_host, resolve
from service.logsafe import loggable
from service.repositories import RepoPolicy, redact_url, validate_repo_url
from service.target_errors import TargetError

log = logging.getLogger(__name__)

_SHA = re.compile(r"[0-9a-fA-F]{4,64}")
_STDERR_TAIL = 2000
# One commit per record (\x1e), fields separated by NUL: sha, parents, author, committer date, message.
_LOG_FORMAT = "%H%x00%P%x00%an <%ae>%x00%cI%x00%B%x1e"


class CheckoutError(Exception):
    """The commit's source tree cannot be produced: a domain error, recorded on the run.

    ``transient``: the remote could not be reached (host not found, no connection, TLS, a timeout); the run is
    then tried again later like a release that could not be installed, not recorded as a broken commit.
    ``configuration``: the repository itself cannot be used (refused by the policy, missing, not a repository,
    no access): an error of the target's configuration, whatever the commit, never a broken commit.
    """

    def __init__(self, message: str, *, transient: bool = False, configuration: bool = False) -> None:
        super().__init__(message)
        self.transient = transient
        self.configuration = configuration


class CommitNotFoundError(CheckoutError):
    pass


def _git_environment() -> dict[str, str]:
    """The worker's environment without specwatch secrets; git never prompts for credentials."""
    env = {name: value for name, value in os.environ.items() if not name.upper().startswith("SPECWATCH_")}
    env.update(GIT_TERMINAL_PROMPT="0", LC_ALL="C")
    return env


# What a failed git command tells a user, by the first pattern its stderr matches: no path, host or URL of
# the worker's is repeated (git's messages differ for a path that exists and one that does not).
_GIT_CAUSES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"transport '[^']*' not allowed|protocol '?[^ ']*'? is not supported|unsupported protocol", re.I), "protocol not allowed"),
    (re.compile(r"could not resolve host|name or service not known|temporary failure in name resolution", re.I), "host not found"),
    (
        re.compile(r"authentication failed|could not read username|permission denied \(publickey|terminal prompts disabled", re.I),
        "authentication failed or required (configure a git credential helper for the worker)",
    ),
    (
        re.compile(r"connection refused|connection timed out|network is unreachable|failed to connect|couldn't connect", re.I),
        "could not connect",
    ),
    (re.compile(r"ssl|certificate", re.I), "TLS error"),
    (
        re.compile(r"not found|does not exist|does not appear to be a git repository|not a git repository|no such", re.I),
        "repository not found or not accessible",
    ),
)


#: Causes of a failed git command that say nothing about the commit: the remote could not be reached.
_TRANSIENT_CAUSES = frozenset({"host not found", "could not connect", "TLS error"})


def summarise_git_error(stderr: str) -> str:
    """One line for a failed git command's ``stderr``: a known cause, else ``see the worker log``."""
    for pattern, cause in _GIT_CAUSES:
        if pattern.search(stderr):
            return cause
    return "see the worker log"


def _policy_args(policy: RepoPolicy) -> list[str]:
    """``-c`` options restricting git to ``policy``'s protocols (also on redirects and submodules)."""
    args = ["-c", "protocol.allow=never"]
    for protocol in sorted(policy.git_protocols()):
        args += ["-c", f"protocol.{protocol}.allow=always"]
    return args


def git(*args: str, cwd: Path | None = None, timeout: float = 600, policy: RepoPolicy | None = None, options: Sequence[str] = ()) -> str:
    """Run git (with ``protocol.allow`` restricted to ``policy``'s protocols; default: the strict policy; ``options``:
    more ``-c`` options, the host pinned by :func:`check_repository`); its stdout, or :class:`CheckoutError` with a
    one-line summary (git's stderr goes to the log)."""
    command = ["git", *_policy_args(policy or RepoPolicy()), *options, *args]
    what = f"git {args[0]}" if args else "git"
    try:
        done = subprocess.run(  # noqa: S603 -- fixed executable, arguments validated by the callers
            command, cwd=cwd, env=_git_environment(), capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise CheckoutError(f"{what} took longer than {timeout:g} s", transient=True) from exc
    except OSError as exc:  # git missing, or ``cwd`` gone: no path of the worker's in the message
        log.info("git_not_started command=%s error=%s", loggable(what), exc)
        raise CheckoutError(f"{what} could not start: {exc.strerror or type(exc).__name__}") from exc
    if done.returncode != 0:
        stderr = done.stderr.strip()[-_STDERR_TAIL:]
        log.info("git_failed command=%s exit=%s stderr=%s", loggable(what), done.returncode, loggable(stderr, 1000))
        cause = summarise_git_error(stderr)
        raise CheckoutError(f"{what} failed (exit {done.returncode}): {cause}", transient=cause in _TRANSIENT_CAUSES)
    return done.stdout


def validate_sha(sha: str) -> str:
    """``sha`` if it is 4 to 64 hex digits (so it can never be read as a git option), else CheckoutError."""
    if not _SHA.fullmatch(sha):
        raise CheckoutError(f"{sha!r} is not a commit id (4 to 64 hexadecimal digits)")
    return sha.lower()


def check_repository(repo_url: str, policy: RepoPolicy) -> list[str]:
    """The git options that pin ``repo_url``'s host to the addresses checked here, if ``policy`` allows the
    repository, also after resolving its host (a name of a private address); else :class:`CheckoutError`.

    Without private hosts allowed, an http(s) host is resolved once, here: every address it resolves to must be
    public, and git is then told to connect to exactly those (``http.curloptResolve``), so a name that resolves
    elsewhere when git connects (DNS rebinding) never reaches a private address; redirects, which git would resolve
    itself, are not followed. An ssh or git:// host is checked the same way but not pinned (git's resolver is
    not curl's there): the default policy allows https only.
    """
    try:
        validate_repo_url(repo_url, policy)
    except TargetError as exc:
        raise CheckoutError(f"repository refused: {exc}", configuration=True) from None
    if policy.allow_private_hosts or repo_url.startswith("/"):
        return []
    host = _host_of(repo_url)
    if not host or is_private_host(host) or ip_of(host) is not None:
        return []  # a literal public address needs no resolving (validate_repo_url refused a private one)
    parts = urlsplit(repo_url) if "://" in repo_url else None
    scheme = parts.scheme if parts is not None else "ssh"
    port = (parts.port if parts is not None else None) or {"https": 443, "http": 80, "git": 9418}.get(scheme, 22)
    addresses = resolve(host, port)
    if any(is_private_address(address) for address in addresses):
        why = f"repository refused: {host} resolves to a private or loopback address (SPECWATCH_ALLOW_PRIVATE_HOSTS)"
        raise CheckoutError(why, configuration=True)
    if scheme not in ("http", "https") or not addresses:
        return []  # not pinned (see above), or a name that does not resolve: git fails on it
    pinned = ",".join(f"[{a}]" if a.version == 6 else str(a) for a in addresses)
    return ["-c", f"http.curloptResolve={host}:{port}:{pinned}", "-c", "http.followRedirects=false"]


def _host_of(repo_url: str) -> str | None:
    if "://" in repo_url:
        return urlsplit(repo_url).hostname
    return repo_url.split("@", 1)[-1].split(":", 1)[0] or None


def ls_remote(repo_url: str, branches: list[str], *, timeout: float = 60, policy: RepoPolicy | None = None) -> dict[str, str]:
    """The current head of each of ``branches`` on the remote (``git ls-remote``); a branch the remote does
    not have is absent. :class:`CheckoutError` when ``policy`` refuses the remote, or it cannot be reached or read."""
    policy = policy or RepoPolicy()
    patterns = [f"refs/heads/{branch}" for branch in branches]
    heads: dict[str, str] = {}
    pins = check_repository(repo_url, policy)
    for line in git("ls-remote", "--refs", "--", repo_url, *patterns, timeout=timeout, policy=policy, options=pins).splitlines():
        sha, _, ref = line.strip().partition("\t")
        if ref in patterns:  # patterns match ref tails (refs/heads/x/refs/heads/main): keep exact names only
            heads[ref.removeprefix("refs/heads/")] = sha.lower()
    return heads


@dataclass(frozen=True)
class GitCommit:
    """A commit as ``git log`` shows it."""

    sha: str
    parents: tuple[str, ...]
    author: str
    committed_at: datetime
    message: str


def _parse_log(output: str) -> list[GitCommit]:
    commits = []
    for raw in output.split("\x1e"):
        record = raw.lstrip("\n")
        if not record:
            continue
        sha, parents, author, date, message = record.split("\x00", 4)
        commits.append(GitCommit(sha, tuple(parents.split()), author, datetime.fromisoformat(date), message.rstrip("\n")))
    return commits


@dataclass(frozen=True)
class MirrorCache:
    """Bare mirrors of target repositories under ``root``, one per repository URL."""

    root: Path
    git_timeout_s: float = 1800
    policy: RepoPolicy = field(default_factory=RepoPolicy)

    def ls_remote(self, repo_url: str, branches: list[str], *, timeout: float = 60) -> dict[str, str]:
        """:func:`ls_remote` under this cache's policy."""
        return ls_remote(repo_url, branches, timeout=timeout, policy=self.policy)

    def _git(self, *args: str, cwd: Path | None = None, timeout: float = 600, options: Sequence[str] = ()) -> str:
        return git(*args, cwd=cwd, timeout=timeout, policy=self.policy, options=options)

    def mirror_path(self, repo_url: str) -> Path:
        """``<root>/<repository name>-<hash of the URL>.git``: readable, and unique per URL."""
        name = repo_url.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git")
        slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-")[:60] or "repo"
        digest = hashlib.sha256(repo_url.encode()).hexdigest()[:12]
        return self.root / f"{slug}-{digest}.git"

    @contextmanager
    def _locked(self, mirror: Path) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with mirror.with_suffix(".lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _resolve(self, mirror: Path, sha: str) -> str | None:
        try:
            return git("rev-parse", "--verify", "--quiet", "--end-of-options", f"{sha}^{{commit}}", cwd=mirror).strip()
        except CheckoutError:
            return None

    def _ensure_commit(self, repo_url: str, sha: str) -> tuple[Path, str]:
        """The mirror holding ``sha`` (cloned or fetched as needed) and the full commit id. Call under the lock."""
        mirror = self.mirror_path(repo_url)
        if not (mirror / "HEAD").exists():
            pins = check_repository(repo_url, self.policy)
            partial = mirror.with_suffix(".partial")
            shutil.rmtree(partial, ignore_errors=True)
            log.info("mirror_clone repo=%s path=%s", loggable(redact_url(repo_url)), mirror)
            try:
                self._git("clone", "--mirror", "--quiet", "--", repo_url, str(partial), timeout=self.git_timeout_s, options=pins)
            except CheckoutError as exc:  # unreachable: transient; else the repository cannot be cloned at all
                raise CheckoutError(str(exc), transient=exc.transient, configuration=True) from exc
            partial.rename(mirror)
        full = self._resolve(mirror, sha)
        if full is None:
            pins = check_repository(repo_url, self.policy)
            log.info("mirror_fetch repo=%s path=%s wanted=%s", loggable(redact_url(repo_url)), mirror, sha)
            self._git("fetch", "--prune", "--quiet", "origin", cwd=mirror, timeout=self.git_timeout_s, options=pins)
            full = self._resolve(mirror, sha)
        if full is None:
            raise CommitNotFoundError(f"commit {sha} does not exist in {redact_url(repo_url)} (not found after fetching every ref)")
        return mirror, full

    def fetch(self, repo_url: str, sha: str) -> str:
        """Make sure the mirror has commit ``sha`` (cloning or fetching as needed); its full id."""
        mirror = self.mirror_path(repo_url)
        with self._locked(mirror):
            return self._ensure_commit(repo_url, validate_sha(sha))[1]

    def first_parent_log(self, repo_url: str, new: str, old: str | None = None) -> list[GitCommit]:
        """The commits of ``old..new`` along ``new``'s first parents, oldest first (fetched into the mirror as
        needed); only ``new`` itself when ``old`` is None. Branch order: merged side branches are not listed."""
        new = validate_sha(new)
        mirror = self.mirror_path(repo_url)
        with self._locked(mirror):
            mirror, full = self._ensure_commit(repo_url, new)
            if old is None:
                output = git("log", "-1", f"--format={_LOG_FORMAT}", "--end-of-options", full, cwd=mirror)
            else:
                span = f"{validate_sha(old)}..{full}"
                output = git("log", "--first-parent", "--reverse", f"--format={_LOG_FORMAT}", "--end-of-options", span, cwd=mirror)
        return _parse_log(output)

    def is_ancestor(self, repo_url: str, old: str, new: str) -> bool:
        """Whether ``old`` is an ancestor of ``new`` in the mirror (False when ``old`` is not there at all)."""
        mirror = self.mirror_path(repo_url)
        with self._locked(mirror):
            try:
                git("merge-base", "--is-ancestor", "--end-of-options", validate_sha(old), validate_sha(new), cwd=mirror)
            except CheckoutError:
                return False
        return True

    @contextmanager
    def worktree(self, repo_url: str, sha: str, dest: Path) -> Iterator[Path]:
        """A detached worktree of ``sha`` at ``dest`` for the duration of the block; removed even on failure."""
        sha = validate_sha(sha)
        mirror = self.mirror_path(repo_url)
        with self._locked(mirror):
            mirror, full = self._ensure_commit(repo_url, sha)
            dest.parent.mkdir(parents=True, exist_ok=True)
            git("worktree", "add", "--detach", "--quiet", str(dest), full, cwd=mirror, timeout=self.git_timeout_s)
        try:
            yield dest
        finally:
            self.remove_worktree(repo_url, dest)

    def remove_worktree(self, repo_url: str, dest: Path) -> None:
        """Remove ``dest`` and forget it in the mirror; never raises (a leftover is pruned next time). Without a
        mirror (none cloned yet, or removed) there is nothing to forget: only ``dest`` is removed, if it exists."""
        mirror = self.mirror_path(repo_url)
        if not (mirror / "HEAD").exists():
            shutil.rmtree(dest, ignore_errors=True)
            return
        with self._locked(mirror):
            try:
                git("worktree", "remove", "--force", str(dest), cwd=mirror)
            except CheckoutError as exc:
                log.debug("worktree_remove_failed path=%s error=%s", dest, exc)
            shutil.rmtree(dest, ignore_errors=True)
            try:
                git("worktree", "prune", cwd=mirror)
            except CheckoutError as exc:
                log.warning("worktree_prune_failed mirror=%s error=%s", mirror, exc)
