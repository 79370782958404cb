"""service.settings: SPECWATCH_* environment, secrets refused when empty outside dev/test, cached builder."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from pydantic import SecretStr, ValidationError

from service.settings import Environment, Settings, get_settings

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No SPECWATCH_* variable and no .env from the developer's shell leaks into a test."""
    for name in [name for name in os.environ if name.startswith("SPECWATCH_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def test_defaults_are_the_embedded_dev_setup() -> None:
    settings = Settings()
    assert settings.env is Environment.dev
    assert settings.database_url == "sqlite:///./specwatch.db"
    assert settings.github_token is None
    assert settings.slack_webhook_url is None


@pytest.mark.parametrize("secret", [None, ""])
def test_prod_refuses_an_empty_webhook_secret(monkeypatch: pytest.MonkeyPatch, secret: str | None) -> None:
    monkeypatch.setenv("SPECWATCH_ENV", "prod")
    if secret is not None:
        monkeypatch.setenv("SPECWATCH_WEBHOOK_SECRET", secret)
    with pytest.raises(ValidationError, match="SPECWATCH_WEBHOOK_SECRET is empty but SPECWATCH_ENV=prod"):
        Settings()


@pytest.mark.parametrize("env", [Environment.dev, Environment.test])
def test_dev_and_test_accept_an_empty_webhook_secret(env: Environment) -> None:
    assert Settings(env=env).webhook_secret.get_secret_value() == ""


def test_environment_variables_are_read_with_the_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECWATCH_ENV", "prod")
    monkeypatch.setenv("SPECWATCH_WEBHOOK_SECRET", "s3cret")
    monkeypatch.setenv("SPECWATCH_DATABASE_URL", "postgresql+psycopg://specwatch@db/specwatch")
    monkeypatch.setenv("SPECWATCH_SLACK_WEBHOOK_URL", "https://hooks.slack.com/services/T/B/X")

    settings = Settings()

    assert settings.env is Environment.prod
    assert settings.webhook_secret.get_secret_value() == "s3cret"
    assert settings.database_url == "postgresql+psycopg://specwatch@db/specwatch"
    assert settings.slack_webhook_url == SecretStr("https://hooks.slack.com/services/T/B/X")
    assert "s3cret" not in repr(settings)
    assert "hooks.slack.com" not in repr(settings)


def test_dotenv_file_is_read(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tmp_path_factory.mktemp("project")
    (directory / ".env").write_text("SPECWATCH_ENV=prod\nSPECWATCH_WEBHOOK_SECRET=from-dotenv\n")
    monkeypatch.chdir(directory)
    assert Settings().webhook_secret.get_secret_value() == "from-dotenv"


def test_get_settings_is_built_once_on_first_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECWATCH_REDIS_URL", "redis://redis:6379/1")
    first = get_settings()
    monkeypatch.setenv("SPECWATCH_REDIS_URL", "redis://elsewhere:6379/1")
    assert get_settings() is first
    assert first.redis_url == "redis://redis:6379/1"
