"""service.targets: what a user may type for a target, and the normal form repositories are matched by."""

from __future__ import annotations

import pytest

from service.addresses import ip_of, is_private_host
from service.models import CommitPolicy, InstallMode
from service.repositories import RepoPolicy, repo_key, validate_repo_url
from service.target_errors import TargetError
from service.targets import format_duration, make_spec, parse_duration, validate_adapter, validate_branch, validate_name

# Everything a policy can allow: ssh, http and git, local paths, private hosts.
OPEN = RepoPolicy(protocols=frozenset({"https", "ssh", "http", "git"}), allow_local=True, allow_private_hosts=True)


def test_a_full_spec_is_normalised() -> None:
    spec = make_spec(
        name=" transformers ",
        repo_url="https://github.com/huggingface/transformers",
        branches=["main", "refs/heads/v4-release", "main"],
        adapter="transformers",
        install_mode="pip",
        poll="5m",
        commit_policy="every",
    )
    assert spec.name == "transformers"
    assert spec.branches == ("main", "v4-release")
    assert (spec.install_mode, spec.poll_interval_s, spec.commit_policy) == (InstallMode.pip, 300, CommitPolicy.every)


@pytest.mark.parametrize("name", ["", "-x", "a b", "x/y", "é", "a" * 101])
def test_bad_names(name: str) -> None:
    with pytest.raises(TargetError, match="invalid target name"):
        validate_name(name)


@pytest.mark.parametrize(
    "url",
    [
        "https://github.com/huggingface/transformers",
        "https://github.com/huggingface/transformers.git",
        "git@github.com:huggingface/transformers.git",
        "ssh://git@example.org:2222/team/lib.git",
        "file:///srv/git/lib.git",
        "/srv/git/lib",
    ],
)
def test_good_repository_urls(url: str) -> None:
    assert validate_repo_url(url, OPEN) == url


@pytest.mark.parametrize("url", ["https://github.com/huggingface/transformers", "https://gitlab.example.org/team/lib.git"])
def test_the_strict_default_accepts_https(url: str) -> None:
    assert validate_repo_url(url) == url


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("git@github.com:huggingface/transformers.git", "ssh protocol is not allowed"),
        ("http://example.org/x", "http protocol is not allowed"),
        ("git://example.org/x", "git protocol is not allowed"),
        ("/srv/git/lib", "local repositories are not allowed"),
        ("file:///etc", "local repositories are not allowed"),
        ("https://127.0.0.1/x", "private or loopback"),
        ("https://localhost/x", "private or loopback"),
        ("https://10.1.2.3/x", "private or loopback"),
        ("https://169.254.169.254/x", "private or loopback"),
        ("https://[::1]/x", "private or loopback"),
        ("https://[::ffff:127.0.0.1]/x", "private or loopback"),
        ("https://2130706433/x", "private or loopback"),
        ("https://0x7f.1/x", "private or loopback"),
        ("https://127.1/x", "private or loopback"),
        ("https://user:pass@github.com/o/r", "credentials"),
        ("https://ghp_token@github.com/o/r", "credentials"),
        ("ssh://git:pw@example.org/x", "credentials"),
        ("file::/etc", "transport"),
        ("ext::sh", "transport"),
        ("fd::3", "transport"),
        ("-uhttps://x", "options"),
    ],
)
def test_the_strict_default_refuses(url: str, why: str) -> None:
    policy = RepoPolicy(protocols=frozenset({"https", "ssh"})) if "ssh://" in url else RepoPolicy()
    with pytest.raises(TargetError, match=why):
        validate_repo_url(url, policy)


def test_credentials_are_not_repeated_in_the_message() -> None:
    with pytest.raises(TargetError) as caught:
        validate_repo_url("https://ada:hunter2@github.com/o/r")
    assert "hunter2" not in str(caught.value)


def test_settings_decide_the_policy() -> None:
    from service.settings import Settings

    dev = RepoPolicy.from_settings(Settings(env="dev"))
    assert (dev.allow_local, dev.allow_private_hosts, dev.git_protocols()) == (True, True, frozenset({"https", "file"}))
    prod = RepoPolicy.from_settings(Settings(env="prod", webhook_secret="s", git_protocols="https,ssh"))  # type: ignore[arg-type]
    assert (prod.allow_local, prod.allow_private_hosts, prod.git_protocols()) == (False, False, frozenset({"https", "ssh"}))
    off = RepoPolicy.from_settings(Settings(env="dev", allow_local_repositories=False, allow_private_hosts=False))
    assert (off.allow_local, off.allow_private_hosts) == (False, False)


def test_unknown_git_protocols_are_refused() -> None:
    from pydantic import ValidationError

    from service.settings import Settings

    with pytest.raises(ValidationError, match="unknown git protocol"):
        Settings(git_protocols="https,ext")  # type: ignore[arg-type]


@pytest.mark.parametrize(("host", "private"), [("github.com", False), ("8.8.8.8", False), ("192.168.1.1", True), ("a.localhost", True)])
def test_private_hosts(host: str, private: bool) -> None:
    assert is_private_host(host) is private


def test_ip_forms_that_resolvers_read() -> None:
    assert str(ip_of("2130706433")) == "127.0.0.1"
    assert ip_of("github.com") is None


@pytest.mark.parametrize(
    "url", ["", "nope", "ftp://example.org/x", "https://", "https://github.com/", "https://x.org/a b", "relative/path"]
)
def test_bad_repository_urls(url: str) -> None:
    with pytest.raises(TargetError, match="invalid repository"):
        validate_repo_url(url)


@pytest.mark.parametrize("branch", ["main", "release/v4.37", "feature-x_1"])
def test_good_branches(branch: str) -> None:
    assert validate_branch(branch) == branch


@pytest.mark.parametrize(
    "branch", ["", "a b", "a..b", "-x", "x.lock", "x/", "a~1", "a^", "a:b", "a?", "a*", "a[", "x/.hidden", "@", "a@{1}"]
)
def test_bad_branches(branch: str) -> None:
    with pytest.raises(TargetError, match="invalid branch"):
        validate_branch(branch)


def test_at_least_one_branch() -> None:
    with pytest.raises(TargetError, match="at least one branch"):
        make_spec(name="x", repo_url="/srv/x", branches=[], adapter="transformers", repo_policy=OPEN)


@pytest.mark.parametrize("adapter", ["transformers", "sglang", "openvino", "toy_sampler.sampler:sample", "m:f"])
def test_good_adapters(adapter: str) -> None:
    assert validate_adapter(adapter) == adapter


@pytest.mark.parametrize("adapter", ["", "tensorrt_llm", "mod:", ":f", "a b:c", "mod:f:g", "1mod:f"])
def test_unknown_adapters_list_the_known_ones(adapter: str) -> None:
    with pytest.raises(TargetError, match=r"unknown adapter .*known: .*transformers"):
        validate_adapter(adapter)


@pytest.mark.parametrize(("value", "seconds"), [("90", 90), ("45s", 45), ("5m", 300), ("2h", 7200), ("1d", 86400), (" 10M ", 600)])
def test_durations(value: str, seconds: int) -> None:
    assert parse_duration(value) == seconds


@pytest.mark.parametrize(
    ("value", "message"), [("5x", "invalid poll interval"), ("m", "invalid"), ("-5m", "invalid"), ("10s", "too short")]
)
def test_bad_durations(value: str, message: str) -> None:
    with pytest.raises(TargetError, match=message):
        parse_duration(value)


@pytest.mark.parametrize(("seconds", "text"), [(None, "-"), (45, "45s"), (300, "5m"), (7200, "2h"), (86400, "1d"), (90, "90s")])
def test_format_duration(seconds: int | None, text: str) -> None:
    assert format_duration(seconds) == text


def test_bad_install_mode_and_policy() -> None:
    with pytest.raises(TargetError, match="invalid install mode 'conda'"):
        make_spec(name="x", repo_url="/srv/x", branches=["main"], adapter="transformers", install_mode="conda", repo_policy=OPEN)
    with pytest.raises(TargetError, match="invalid commit policy 'some'"):
        make_spec(name="x", repo_url="/srv/x", branches=["main"], adapter="transformers", commit_policy="some", repo_policy=OPEN)


@pytest.mark.parametrize(
    "url",
    [
        "https://github.com/huggingface/transformers",
        "https://github.com/huggingface/transformers.git",
        "https://github.com/HuggingFace/Transformers/",
        "http://github.com/huggingface/transformers",
        "git@github.com:huggingface/transformers.git",
        "ssh://git@github.com/huggingface/transformers",
        "git://github.com/huggingface/transformers.git",
        "https://user:token@github.com:443/huggingface/transformers.git",
    ],
)
def test_repo_key_identifies_one_repository_across_url_forms(url: str) -> None:
    assert repo_key(url) == "github.com/huggingface/transformers"


def test_repo_key_of_local_and_other_repositories() -> None:
    assert repo_key("/srv/git/Lib.git") == repo_key("file:///srv/git/Lib") == "/srv/git/Lib"
    assert repo_key("/srv/git/lib") != repo_key("/srv/git/Lib")
    assert repo_key("https://gitlab.com/a/b") != repo_key("https://github.com/a/b")
    assert repo_key("") is None
    assert repo_key("ftp://x.org/a") is None
    assert repo_key("https://github.com/") is None
