"""The control plane's one settings object, read from ``SPECWATCH_*`` environment variables (or ``.env``).

Build it with :func:`get_settings` (cached, never at import time); tests build their own ``Settings(...)``.
Secrets have no default and are refused when empty outside ``dev``/``test``.
"""

from __future__ import annotations

import re
from enum import StrEnum
from functools import lru_cache
from typing import Annotated

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class Environment(StrEnum):
    dev = "dev"
    test = "test"
    prod = "prod"


class Settings(BaseSettings):
    """specwatch control-plane settings; every field is ``SPECWATCH_<FIELD>`` in the environment."""

    model_config = SettingsConfigDict(env_prefix="SPECWATCH_", env_file=".env", env_file_encoding="utf-8", extra="ignore")

    env: Environment = Environment.dev
    database_url: str = "sqlite:///./specwatch.db"
    redis_url: str = "redis://127.0.0.1:6379/0"
    # Verifies X-Hub-Signature-256 on GitHub webhooks. Empty unless set, and refused empty outside dev/test:
    # an empty secret would accept forged pushes.
    webhook_secret: SecretStr = SecretStr("")
    github_token: SecretStr | None = None
    # The GitHub REST API that commit statuses are posted to (GitHub Enterprise: https://HOST/api/v3).
    github_api_url: str = "https://api.github.com"
    slack_webhook_url: SecretStr | None = None
    dashboard_url: str = "http://127.0.0.1:8000"
    # Larger webhook bodies are refused (413) while they are read. GitHub caps payloads at 25 MB.
    webhook_max_body_bytes: int = Field(default=25 * 1024 * 1024, gt=0)
    # The suite profile of runs queued by webhooks and pollers.
    run_profile: str = Field(default="default", min_length=1, max_length=50)
    # A queued run that no worker has started by then is re-enqueued by the sweeper (workers.sweep_runs):
    # it repairs a lost message or an enqueue that failed after commit (broker down).
    queued_lease_s: int = Field(default=15 * 60, gt=0)
    # API bearer tokens, stored as the SHA-256 hex digests of the tokens (comma-separated), never the tokens:
    # `printf %s "$TOKEN" | sha256sum`. Write tokens may also read; read tokens only read (403 on writes).
    # Writes (targets, alerts) always need a write token: with none configured, every write is refused (401).
    api_token_hashes: Annotated[list[str], NoDecode] = Field(default_factory=list)
    api_read_token_hashes: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # Whether reads (GET of the API and the dashboard) need a token too; off by default.
    api_auth_reads: bool = False

    @field_validator("api_token_hashes", "api_read_token_hashes", mode="before")
    @classmethod
    def _split_hashes(cls, value: object) -> object:
        if isinstance(value, str):
            return [item.strip() for item in value.split(",") if item.strip()]
        return value

    @field_validator("api_token_hashes", "api_read_token_hashes")
    @classmethod
    def _check_hashes(cls, value: list[str]) -> list[str]:
        bad = [item for item in value if not _SHA256_HEX.fullmatch(item.lower())]
        if bad:
            raise ValueError(f"{len(bad)} token hash(es) are not SHA-256 hex digests (64 hex digits): store sha256(token), not the token")
        return [item.lower() for item in value]

    @model_validator(mode="after")
    def _secrets_required_outside_dev(self) -> Settings:
        if self.env not in (Environment.dev, Environment.test) and not self.webhook_secret.get_secret_value():
            raise ValueError(
                f"SPECWATCH_WEBHOOK_SECRET is empty but SPECWATCH_ENV={self.env.value}: "
                "set it to the secret configured on the GitHub webhook (required outside dev/test)"
            )
        return self


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, built on first use from the environment."""
    return Settings()
