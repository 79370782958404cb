"""service.webhooks without a database: the signature, the body's parsing, and a push's shape."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import pytest

from service.webhooks import PayloadError, PushEvent, SignatureError, parse_payload, parse_push, signature, verify_signature

SHA_A, SHA_B, SHA_C = "a" * 40, "b" * 40, "c" * 40


def test_signature_is_githubs_hmac_sha256_of_the_raw_body() -> None:
    body = b'{"zen": "Keep it logically awesome."}'
    expected = "sha256=" + hmac.new(b"It's a Secret to Everybody", body, hashlib.sha256).hexdigest()
    assert signature("It's a Secret to Everybody", body) == expected
    verify_signature("It's a Secret to Everybody", body, expected)


def test_githubs_documented_example() -> None:
    # docs.github.com, "Validating webhook deliveries": secret "It's a Secret to Everybody", payload "Hello, World!".
    expected = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    verify_signature("It's a Secret to Everybody", b"Hello, World!", expected)


@pytest.mark.parametrize(
    ("secret", "header", "message"),
    [
        ("s", None, "missing"),
        ("s", "", "missing"),
        ("s", "sha256=" + "0" * 64, "does not match"),
        ("s", "sha1=" + "0" * 40, "does not match"),
        ("", "sha256=" + "0" * 64, "SPECWATCH_WEBHOOK_SECRET is not set"),
    ],
)
def test_bad_signatures(secret: str, header: str | None, message: str) -> None:
    with pytest.raises(SignatureError, match=message):
        verify_signature(secret, b"{}", header)


def test_an_empty_secret_refuses_even_a_matching_signature() -> None:
    with pytest.raises(SignatureError, match="not set"):
        verify_signature("", b"{}", signature("", b"{}"))


def test_parse_payload_json_and_form() -> None:
    assert parse_payload(b'{"a": 1}', "application/json") == {"a": 1}
    assert parse_payload(b"payload=%7B%22a%22%3A+1%7D", "application/x-www-form-urlencoded; charset=utf-8") == {"a": 1}


@pytest.mark.parametrize("body", [b"", b"{", b"[]", b"null", b"\xff"])
def test_parse_payload_refuses_what_is_not_a_json_object(body: bytes) -> None:
    with pytest.raises(PayloadError):
        parse_payload(body, "application/json")


def a_push(**fields: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "ref": "refs/heads/main",
        "before": SHA_A,
        "after": SHA_C,
        "commits": [{"id": SHA_B, "message": "b"}, {"id": SHA_C, "message": "c"}],
        "head_commit": {"id": SHA_C, "message": "c"},
        "repository": {"full_name": "Org/Repo", "html_url": "https://github.com/Org/Repo", "clone_url": "https://github.com/Org/Repo.git"},
    }
    payload.update(fields)
    return payload


def test_pushed_commits_end_with_the_head() -> None:
    assert [c.id for c in parse_push(a_push()).pushed_commits()] == [SHA_B, SHA_C]
    created = parse_push(a_push(commits=[], head_commit={"id": SHA_C}))
    assert [c.id for c in created.pushed_commits()] == [SHA_C]
    bare = parse_push(a_push(commits=[], head_commit=None))
    assert [c.id for c in bare.pushed_commits()] == [SHA_C]


def test_repo_keys_cover_every_url_and_the_full_name() -> None:
    keys = parse_push(a_push()).repo_keys()
    assert keys == {"github.com/org/repo"}
    enterprise = PushEvent.model_validate(a_push(repository={"full_name": "team/lib", "html_url": "https://git.example.org/team/lib"}))
    assert enterprise.repo_keys() == {"git.example.org/team/lib"}
    only_name = PushEvent.model_validate(a_push(repository={"full_name": "team/lib"}))
    assert only_name.repo_keys() == {"github.com/team/lib"}


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"ref": None}, "ref"),
        ({"after": "not-a-sha"}, "after"),
        ({"commits": [{"message": "no id"}]}, "commits.0.id"),
        ({"repository": "x"}, "repository"),
    ],
)
def test_malformed_pushes_say_where(change: dict[str, Any], where: str) -> None:
    with pytest.raises(PayloadError, match=f"not a GitHub push payload: {where}"):
        parse_push(a_push(**change))


def test_a_payload_round_trips_through_json() -> None:
    assert parse_push(json.loads(json.dumps(a_push()))).after == SHA_C


def test_every_string_of_a_payload_is_cut_at_the_limit_with_a_marker() -> None:
    from service.textlimits import CUT_MARKER
    from service.webhooks.payload import PAYLOAD_STRING_MAX

    long = "z" * (PAYLOAD_STRING_MAX + 1)
    payload = parse_payload(json.dumps({"zen": long, "nested": {"list": [long, "short"]}, long: 1}).encode(), "application/json")
    cut_text = "z" * (PAYLOAD_STRING_MAX - len(CUT_MARKER)) + CUT_MARKER
    assert payload["zen"] == cut_text
    assert payload["nested"]["list"] == [cut_text, "short"]
    assert payload[cut_text] == 1
    assert parse_payload(json.dumps({"zen": "z" * PAYLOAD_STRING_MAX}).encode(), None)["zen"] == "z" * PAYLOAD_STRING_MAX
