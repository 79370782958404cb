"""Sending one outbox row: Slack's incoming webhook (slack_sdk), GitHub's commit statuses and check runs (httpx).

Each sender returns what happened (:class:`Sent`) and never raises for the receiver's answer: 2xx is sent, a 429
(or GitHub's 403 with ``Retry-After``) is deferred, a 5xx or a network error is retried, another 4xx is given up
(:func:`workers.notify.deliver_due` records which). Secrets come from :class:`Channels` and are scrubbed from every
error text.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
from slack_sdk.webhook import WebhookClient

from service.models import NotificationChannel

# slack_sdk logs the webhook URL at DEBUG: its logger never goes below WARNING.
_slack_log = logging.getLogger("specwatch.slack")
_slack_log.setLevel(logging.WARNING)


@dataclass(frozen=True)
class Channels:
    """What sending needs: the secrets and the limits."""

    slack_webhook_url: str | None
    github_token: str | None
    github_checks_token: str | None = None  # check runs; None: github_token
    github_api_url: str = "https://api.github.com"
    timeout_s: float = 10
    backoff_s: float = 30
    backoff_max_s: float = 3600
    max_attempts: int = 25

    def scrub(self, text: str) -> str:
        """Remove the secrets, and the Slack URL's path on its own (the path is the secret part and an
        error body may echo it without the host)."""
        secrets = [self.slack_webhook_url, self.github_token, self.github_checks_token]
        if self.slack_webhook_url:
            path = urlsplit(self.slack_webhook_url).path
            secrets += [path, path.lstrip("/")] if len(path.strip("/")) >= 8 else []
        for secret in sorted((s for s in secrets if s), key=len, reverse=True):
            text = text.replace(secret, "[secret]")
        return text


@dataclass(frozen=True)
class Sent:
    ok: bool
    retry_after_s: float | None = None  # a 429
    retryable: bool = True  # a 5xx or a network error (False: a 4xx that retrying cannot fix)
    error: str | None = None


def _retry_after(headers: Any) -> float:
    for name in ("Retry-After", "retry-after"):
        value = headers.get(name) if headers is not None else None
        if value is not None:
            try:
                return max(0.0, float(value))
            except ValueError:
                break
    return 1.0


def send_slack(payload: dict[str, Any], channels: Channels) -> Sent:
    if not channels.slack_webhook_url:
        return Sent(False, retryable=False, error="Slack is not configured (SPECWATCH_SLACK_WEBHOOK_URL)")
    client = WebhookClient(channels.slack_webhook_url, timeout=max(1, int(channels.timeout_s)), logger=_slack_log, retry_handlers=[])
    try:
        response = client.send(text=payload.get("text"), blocks=payload.get("blocks"))
    except OSError as exc:  # urllib's URLError, timeouts, refused connections
        return Sent(False, error=channels.scrub(f"{type(exc).__name__}: {exc}"))
    if 200 <= response.status_code < 300:
        return Sent(True)
    error = channels.scrub(f"HTTP {response.status_code}: {str(response.body)[:300]}")
    if response.status_code == 429:
        return Sent(False, retry_after_s=_retry_after(response.headers), error=error)
    return Sent(False, retryable=response.status_code >= 500, error=error)


def send_github(payload: dict[str, Any], channels: Channels) -> Sent:
    """A commit status: ``POST /repos/{owner}/{repo}/statuses/{sha}``."""
    url = f"{channels.github_api_url.rstrip('/')}/repos/{payload['repo']}/statuses/{payload['sha']}"
    body = {key: payload[key] for key in ("state", "target_url", "description", "context")}
    return _post_github(url, body, channels, channels.github_token, "SPECWATCH_GITHUB_TOKEN")


def send_github_check(payload: dict[str, Any], channels: Channels) -> Sent:
    """A check run: ``POST /repos/{owner}/{repo}/check-runs`` (needs a GitHub App's token with checks: write:
    ``github_checks_token``, else ``github_token``)."""
    url = f"{channels.github_api_url.rstrip('/')}/repos/{payload['repo']}/check-runs"
    keys = ("name", "head_sha", "status", "conclusion", "details_url", "external_id", "output")
    token, setting = channels.github_checks_token, "SPECWATCH_GITHUB_CHECKS_TOKEN"
    if not token:
        token, setting = channels.github_token, "SPECWATCH_GITHUB_TOKEN"
    return _post_github(url, {key: payload[key] for key in keys}, channels, token, setting)


def _post_github(url: str, body: dict[str, Any], channels: Channels, token: str | None, setting: str) -> Sent:
    if not token:
        return Sent(False, retryable=False, error=f"GitHub is not configured ({setting})")
    headers = {
        "Authorization": f"Bearer {token}",
        "Accept": "application/vnd.github+json",
        "X-GitHub-Api-Version": "2022-11-28",
    }
    try:
        response = httpx.post(url, json=body, headers=headers, timeout=channels.timeout_s)
    except httpx.HTTPError as exc:
        return Sent(False, error=channels.scrub(f"{type(exc).__name__}: {exc}"))
    if response.is_success:
        return Sent(True)
    error = channels.scrub(f"HTTP {response.status_code}: {response.text[:300]}")
    limited = response.status_code == 429 or (response.status_code == 403 and "retry-after" in response.headers)
    if limited:
        return Sent(False, retry_after_s=_retry_after(response.headers), error=error)
    return Sent(False, retryable=response.status_code >= 500, error=error)


SENDERS: dict[NotificationChannel, Callable[[dict[str, Any], Channels], Sent]] = {
    NotificationChannel.slack: send_slack,
    NotificationChannel.github: send_github,
    NotificationChannel.github_check: send_github_check,
}
