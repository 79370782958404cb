"""Which repositories a target may name and a worker may fetch (:class:`RepoPolicy`), a repository URL checked against
it (:func:`validate_repo_url`), shown without its password (:func:`redact_url`) and in its normal form (:func:`repo_key`,
by which a webhook's repository is matched to the targets that watch it), and git's ref-name rules (:func:`is_ref_name`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from service.addresses import is_private_host
from service.settings import Settings
from service.target_errors import TargetError

_SCP_LIKE = re.compile(r"^[\w.+-]+@(?P<host>[^:/\s]+):(?P<path>\S+)$")
_URL_SCHEMES = ("https", "http", "ssh", "git", "file")
# git's "<transport>::<address>" syntax (ext::, file::, fd::): a remote helper chosen by the URL; never allowed.
_TRANSPORT_PREFIX = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*::")
#: The network protocols a repository may be fetched with (``file`` is :attr:`RepoPolicy.allow_local`).
GIT_PROTOCOLS = ("https", "ssh", "http", "git")
REPO_MAX = 500


@dataclass(frozen=True)
class RepoPolicy:
    """Which repositories may be watched and fetched: the same rules when a target is added (API, CLI) and
    when the worker runs git (:class:`workers.checkout.MirrorCache`), which also restricts git's
    ``protocol.allow`` to :meth:`git_protocols`.

    The default is the strict one: https only, no local path, no private or loopback host.
    """

    protocols: frozenset[str] = field(default_factory=lambda: frozenset({"https"}))
    allow_local: bool = False
    allow_private_hosts: bool = False

    @classmethod
    def from_settings(cls, settings: Settings) -> RepoPolicy:
        return cls(
            protocols=frozenset(settings.git_protocols),
            allow_local=settings.local_repositories_allowed,
            allow_private_hosts=settings.private_hosts_allowed,
        )

    def git_protocols(self) -> frozenset[str]:
        """The protocols git may use: :attr:`protocols`, and ``file`` when local repositories are allowed."""
        return self.protocols | ({"file"} if self.allow_local else set())


def _scheme_of(url: str) -> str:
    if _SCP_LIKE.match(url):
        return "ssh"
    if url.startswith("/"):
        return "file"
    return urlsplit(url).scheme


def validate_repo_url(url: str, policy: RepoPolicy | None = None) -> str:
    """A clonable repository that ``policy`` (default: the strict :class:`RepoPolicy`) allows.

    Forms: ``https://``, ``http://``, ``ssh://``, ``git://``, ``user@host:path`` (ssh), and, when local
    repositories are allowed, ``file://`` and absolute paths. Always refused: credentials in the URL (use a git
    credential helper), git's ``transport::address`` form (``ext::``, ``file::``) and options (``-...``).
    """
    policy = policy or RepoPolicy()
    url = url.strip()
    if not url or len(url) > REPO_MAX or any(c.isspace() or not c.isprintable() for c in url):
        raise TargetError(f"invalid repository {redact_url(url)!r}: give a clone URL of at most {REPO_MAX} characters, without spaces")
    if url.startswith("-") or _TRANSPORT_PREFIX.match(url):
        raise TargetError(f"invalid repository {redact_url(url)!r}: git transports (transport::address) and options are not allowed")
    scheme = _scheme_of(url)
    if scheme not in _URL_SCHEMES:
        schemes = ", ".join(f"{scheme}://" for scheme in _URL_SCHEMES)
        raise TargetError(f"invalid repository {redact_url(url)!r}: use a {schemes}, user@host:path or /absolute/path URL")
    if scheme == "file":
        if not policy.allow_local:
            raise TargetError(
                f"invalid repository {redact_url(url)!r}: local repositories are not allowed (SPECWATCH_ALLOW_LOCAL_REPOSITORIES)"
            )
        if not url.startswith("/") and urlsplit(url).netloc not in ("", "localhost"):
            raise TargetError(f"invalid repository {redact_url(url)!r}: a file:// URL names no host")
        return url
    if scheme not in policy.protocols:
        allowed = ", ".join(sorted(policy.protocols))
        raise TargetError(
            f"invalid repository {redact_url(url)!r}: the {scheme} protocol is not allowed (allowed: {allowed}; SPECWATCH_GIT_PROTOCOLS)"
        )
    host, path, user, password = _network_parts(url)
    if password is not None or (user is not None and scheme != "ssh"):
        raise TargetError(
            f"invalid repository URL: credentials in the URL are not allowed (give them to git with a credential helper): {redact_url(url)}"
        )
    if not policy.allow_private_hosts and is_private_host(host):
        raise TargetError(f"invalid repository {redact_url(url)!r}: {host} is a private or loopback host (SPECWATCH_ALLOW_PRIVATE_HOSTS)")
    if not path.strip("/"):
        raise TargetError(f"invalid repository {redact_url(url)!r}: the URL has no repository path")
    return url


def _network_parts(url: str) -> tuple[str, str, str | None, str | None]:
    """(host, path, user, password) of a network repository URL; :class:`TargetError` when malformed."""
    scp = _SCP_LIKE.match(url)
    if scp is not None:
        return scp["host"], scp["path"], None, None
    parts = urlsplit(url)
    try:
        host, user, password = parts.hostname or "", parts.username, parts.password
        parts.port  # noqa: B018 -- raises ValueError for a port out of range
    except ValueError:
        raise TargetError(f"invalid repository {url!r}: the URL's host or port is malformed") from None
    if not host:
        raise TargetError(f"invalid repository {url!r}: the URL has no host")
    return host, parts.path, user, password


def redact_url(url: str) -> str:
    """``url`` without the password of its user info (``https://user:***@host/...``), for messages and logs."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    authority, sep, tail = rest.partition("/")
    userinfo, at, hostport = authority.rpartition("@")
    if not at:
        return url
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{hostport}{sep}{tail}"


def is_ref_name(name: str) -> bool:
    """Whether ``name`` follows git's ref-name rules (``git check-ref-format``): no control character, space,
    ``~^:?*[\\``, ``..``, ``@{`` or ``//``; no component starting with ``.`` or ending with ``.lock``; not
    ``@``, not starting with ``-`` or ``/``, not ending with ``/`` or ``.``."""
    return not (
        not name
        or name.startswith(("-", "/"))
        or name.endswith(("/", ".", ".lock"))
        or ".." in name
        or "//" in name
        or "@{" in name
        or name == "@"
        or any(c.isspace() or c in "~^:?*[\\" or ord(c) < 32 or ord(c) == 127 for c in name)
        or any(part.startswith(".") or part.endswith(".lock") for part in name.split("/"))
    )


def check_local_repository(url: str) -> None:
    """A local repository (an absolute path or a ``file://`` URL) exists and is a git repository; else
    :class:`TargetError` saying so. A network URL is left to the pollers and workers: when it cannot be cloned,
    the target gets one configuration alert with the cause (``workers.analysis.configuration``)."""
    if _scheme_of(url) != "file":
        return
    path = Path(urlsplit(url).path if url.startswith("file:") else url)
    if not path.exists():
        raise TargetError(f"repository {url!r} does not exist: give the path of a git repository on this machine, or a clone URL")
    if not ((path / "HEAD").is_file() or (path / ".git").exists()):
        raise TargetError(f"repository {url!r} is not a git repository (it has no .git, and no HEAD as a bare repository has)")


def repo_key(url: str) -> str | None:
    """The normal form of a repository URL: ``host/path`` (lower case, no scheme, user, port or ``.git``);
    ``/path`` for a local repository. ``None`` when ``url`` is not a repository URL.

    ``https://github.com/Huggingface/transformers.git``, ``git@github.com:huggingface/transformers`` and
    ``ssh://git@github.com/huggingface/transformers`` all give ``github.com/huggingface/transformers``.
    """
    url = url.strip()
    if not url:
        return None
    scp = _SCP_LIKE.match(url)
    if scp is not None:
        host, path = scp["host"], scp["path"]
    elif url.startswith("/"):
        host, path = "", url
    else:
        parts = urlsplit(url)
        if parts.scheme not in _URL_SCHEMES:
            return None
        host, path = ("" if parts.scheme == "file" else (parts.hostname or "")), parts.path
    path = path.strip("/").removesuffix(".git").rstrip("/")
    if not path:
        return None
    if not host:
        return str(PurePosixPath("/", path))
    return f"{host.lower()}/{path.lower()}"
