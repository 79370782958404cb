"""Step 3 of a webhook request: the verified body parsed into a payload as GitHub sends it (400 otherwise)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any
from urllib.parse import parse_qs

from pydantic import AfterValidator, BaseModel, ConfigDict, StringConstraints, ValidationError

from service.logsafe import loggable
from service.repositories import is_ref_name, repo_key
from service.textlimits import cut

ZERO_SHA = frozenset({"0" * 40, "0" * 64})
# The deepest JSON nesting accepted: GitHub's payloads nest a few levels; deeper is refused (400) before
# Python's recursion limit can turn it into a 500.
JSON_DEPTH_MAX = 64
# The longest string kept from a signed payload (characters): longer ones are cut with a marker as they are
# parsed, before anything stores, echoes or logs them (issue 28, item 6: a ping's 9 MB zen was stored and
# echoed whole). The fields specwatch keeps have tighter limits of their own (service.ingest, deliveries).
PAYLOAD_STRING_MAX = 64 * 1024


Sha = Annotated[str, StringConstraints(pattern=r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")]


class _Payload(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class PushAuthor(_Payload):
    name: str | None = None
    email: str | None = None
    username: str | None = None


class PushCommit(_Payload):
    id: Sha
    message: str | None = None
    timestamp: datetime | None = None
    author: PushAuthor | None = None
    distinct: bool = True


class PushRepository(_Payload):
    full_name: str | None = None
    clone_url: str | None = None
    html_url: str | None = None
    ssh_url: str | None = None
    git_url: str | None = None
    url: str | None = None


def _git_ref(ref: str) -> str:
    if not is_ref_name(ref):
        raise ValueError("not a valid git ref name")
    return ref


class PushEvent(_Payload):
    """The fields of GitHub's ``push`` payload that specwatch uses."""

    ref: Annotated[str, StringConstraints(min_length=1, max_length=255), AfterValidator(_git_ref)]
    before: Sha
    after: Sha
    created: bool = False
    deleted: bool = False
    forced: bool = False
    commits: list[PushCommit] = []
    head_commit: PushCommit | None = None
    repository: PushRepository

    def repo_keys(self) -> set[str]:
        """Every normal form (:func:`service.targets.repo_key`) under which this repository may be registered."""
        repo = self.repository
        urls = [repo.clone_url, repo.html_url, repo.ssh_url, repo.git_url, repo.url]
        if repo.full_name:
            host = (repo_key(repo.html_url or "") or "github.com/").split("/", 1)[0] or "github.com"
            urls.append(f"https://{host}/{repo.full_name}")
        return {key for url in urls if url and (key := repo_key(url)) is not None}

    def pushed_commits(self) -> list[PushCommit]:
        """The commits the push brought, oldest first, ending with the new head (when it is known)."""
        commits = list(self.commits)
        seen = {c.id for c in commits}
        if self.head_commit is not None and self.head_commit.id not in seen:
            commits.append(self.head_commit)
        elif self.head_commit is None and self.after not in seen and self.after not in ZERO_SHA:
            commits.append(PushCommit(id=self.after))
        return commits


class PayloadError(ValueError):
    """The body is not a payload as GitHub sends it."""


def parse_payload(body: bytes, content_type: str | None) -> dict[str, Any]:
    """The JSON object in ``body`` (``application/json``, or ``payload=`` in a form-encoded body)."""
    try:
        text = body.decode()
        if (content_type or "").split(";")[0].strip().lower() == "application/x-www-form-urlencoded":
            text = parse_qs(text, strict_parsing=True).get("payload", [""])[0]
        payload = json.loads(text)
    except RecursionError:
        raise PayloadError(f"body nests JSON deeper than {JSON_DEPTH_MAX} levels") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise PayloadError(f"body is not valid JSON: {loggable(exc)}") from exc
    if not isinstance(payload, dict):
        raise PayloadError("body is not a JSON object")
    _check_git_names(payload)
    return {_storable(key): _storable(value) for key, value in payload.items()}


#: Top-level fields that name git objects: checked as sent, before :func:`_storable` would repair them.
_GIT_NAMES = ("ref", "before", "after")


def _check_git_names(payload: dict[str, Any]) -> None:
    """Refuse a payload whose ref or commit ids hold what git never allows in one (NUL, lone surrogates):
    repaired to U+FFFD for storage, ``refs/heads/\\u0000x`` would pass as another, valid-looking name."""
    for field in _GIT_NAMES:
        value = payload.get(field)
        if isinstance(value, str) and _storable(value) != value:
            what = "a valid git ref name" if field == "ref" else "a commit id"
            raise PayloadError(f"{field}: not {what} (it holds a NUL or an unpaired surrogate)")


def _storable(value: Any, depth: int = 1) -> Any:
    """``value`` with every string made storable as PostgreSQL text: valid JSON may hold NUL (``\\u0000``) and
    lone surrogates (``\\ud800``), which PostgreSQL refuses: they become U+FFFD (no push is lost to them); and
    cut at :data:`PAYLOAD_STRING_MAX` characters. :class:`PayloadError` past :data:`JSON_DEPTH_MAX` levels of nesting."""
    if depth > JSON_DEPTH_MAX:
        raise PayloadError(f"body nests JSON deeper than {JSON_DEPTH_MAX} levels")
    if isinstance(value, str):
        value = cut(value, PAYLOAD_STRING_MAX)
        try:
            value.encode()
        except UnicodeEncodeError:
            value = value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
        return value.replace("\x00", "\ufffd")
    if isinstance(value, list):
        return [_storable(item, depth + 1) for item in value]
    if isinstance(value, dict):
        return {_storable(key): _storable(item, depth + 1) for key, item in value.items()}
    return value


def parse_push(payload: dict[str, Any]) -> PushEvent:
    try:
        return PushEvent.model_validate(payload)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors(include_input=False)[:3])
        raise PayloadError(f"not a GitHub push payload: {problems}") from exc
