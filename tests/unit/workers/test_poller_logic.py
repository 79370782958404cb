"""The release list of a package index, as the release poller reads it (pure parsing; the HTTP side and the
database are in tests/integration/workers/test_pollers.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from service.releases import pip_requirement, release_sha, release_version
from workers.pollers import PackageIndexError, parse_releases

pytestmark = pytest.mark.unit


def _file(*, yanked: bool = False, uploaded: str = "2024-11-25T16:39:32.123456Z") -> dict[str, Any]:
    return {"filename": "x.whl", "yanked": yanked, "upload_time_iso_8601": uploaded}


def test_final_releases_with_a_live_file_in_version_order() -> None:
    payload = {
        "releases": {
            "4.10.0": [_file()],
            "4.9.0": [_file(), _file(yanked=True)],
            "4.46.3": [_file(uploaded="2024-11-26T00:00:00Z"), _file(uploaded="2024-11-25T00:00:00Z")],
            "4.47.0rc1": [_file()],
            "4.48.0.dev0": [_file()],
            "4.45.0": [_file(yanked=True)],
            "4.44.0": [],
            "4.1.post1": [_file()],
            "legacy-version": [_file()],
            "1." + "0" * 60: [_file()],  # too long for a commit id
        }
    }

    releases = parse_releases(payload)

    assert [r.version for r in releases] == ["4.1.post1", "4.9.0", "4.10.0", "4.46.3"]
    assert releases[-1].uploaded_at == datetime(2024, 11, 25, tzinfo=UTC)  # its first upload


@pytest.mark.parametrize("payload", [[], {"info": {}}, {"releases": []}, None])
def test_an_answer_without_a_release_list_is_an_index_error(payload: Any) -> None:
    with pytest.raises(PackageIndexError, match="no 'releases'"):
        parse_releases(payload)


def test_release_commit_ids() -> None:
    assert release_sha("4.46.3") == "release:4.46.3"
    assert release_version("release:4.46.3") == "4.46.3"
    assert release_version("a" * 40) is None
    assert pip_requirement("transformers", "release:4.46.3") == "transformers==4.46.3"
    with pytest.raises(ValueError, match="not a release"):
        pip_requirement("transformers", "a" * 40)
