"""``specwatch findings list|add|edit|remove|seed`` and the seeding of ``targets add``, on real PostgreSQL."""

from __future__ import annotations

import json

import pytest
from click.testing import Result
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from service.cli import app
from specwatch.findings import shipped_findings
from tests.support.history import FAILING_CASE, TARGET, seed_history

pytestmark = pytest.mark.integration

runner = CliRunner()


def specwatch(factory: sessionmaker[Session], *args: str) -> Result:
    return runner.invoke(app, list(args), obj=factory)


@pytest.fixture
def toy(rolled_back_factory: sessionmaker[Session]) -> str:
    added = specwatch(
        rolled_back_factory, "targets", "add", "toy", "--repo", "https://github.com/octo-org/toy", "--branch", "main",
        "--adapter", "toy_lib.sampler:sample", "--install", "source",
    )  # fmt: skip
    assert added.exit_code == 0, added.output
    assert "seeded" not in added.output
    return "toy"


def test_add_list_edit_and_remove(rolled_back_factory: sessionmaker[Session], toy: str) -> None:
    empty = specwatch(rolled_back_factory, "findings", "list", toy)
    assert empty.exit_code == 0, empty.output
    assert "no known findings for toy" in empty.output
    added = specwatch(
        rolled_back_factory, "findings", "add", toy, "toy-residual", "--title", "The toy sampler swaps its residual",
        "--case", "direct/far_apart/*", "--case", "direct/near/V8/g2", "--link", "https://github.com/octo-org/toy/issues/7",
        "--versions", ">=0.1",
    )  # fmt: skip
    assert added.exit_code == 0, added.output
    assert "added known finding toy-residual of toy" in added.output

    table = specwatch(rolled_back_factory, "findings", "list", toy)
    assert table.exit_code == 0, table.output
    assert "toy-residual" in table.output
    assert "direct/far_apart/*" in table.output

    edited = specwatch(
        rolled_back_factory, "findings", "edit", toy, "toy-residual", "--state", "fixed", "--fixed-in", "0.3.0", "--versions", ">=0.1,<0.3",
        "--json",
    )  # fmt: skip
    assert edited.exit_code == 0, edited.output
    body = json.loads(edited.stdout)
    assert (body["state"], body["fixed_in"], body["versions"], body["cases"]) == (
        "fixed",
        "0.3.0",
        ">=0.1,<0.3",
        ["direct/far_apart/*", "direct/near/V8/g2"],
    )
    cleared = specwatch(rolled_back_factory, "findings", "edit", toy, "toy-residual", "--versions", "", "--json")
    assert json.loads(cleared.stdout)["versions"] is None

    listed = json.loads(specwatch(rolled_back_factory, "findings", "list", toy, "--json").stdout)
    assert [(f["key"], f["state"]) for f in listed] == [("toy-residual", "fixed")]
    removed = specwatch(rolled_back_factory, "findings", "remove", toy, "toy-residual")
    assert removed.exit_code == 0, removed.output
    assert json.loads(specwatch(rolled_back_factory, "findings", "list", toy, "--json").stdout) == []


def test_distributions_are_added_listed_replaced_and_cleared(rolled_back_factory: sessionmaker[Session], toy: str) -> None:
    added = specwatch(
        rolled_back_factory, "findings", "add", toy, "cpu-bug", "--title", "t", "--case", "a/*", "--link", "https://x.org/1",
        "--distribution", "toy-cpu", "--json",
    )  # fmt: skip
    assert added.exit_code == 0, added.output
    assert json.loads(added.stdout)["distributions"] == ["toy-cpu"]
    table = specwatch(rolled_back_factory, "findings", "list", toy)
    assert "toy-cpu" in table.output
    assert "distributions" in table.output
    both = ["--distribution", "toy", "--distribution", "Toy_GPU"]
    replaced = specwatch(rolled_back_factory, "findings", "edit", toy, "cpu-bug", *both, "--json")
    assert json.loads(replaced.stdout)["distributions"] == ["toy", "toy-gpu"]
    cleared = specwatch(rolled_back_factory, "findings", "edit", toy, "cpu-bug", "--distribution", "", "--json")
    assert json.loads(cleared.stdout)["distributions"] == []
    assert "any" in specwatch(rolled_back_factory, "findings", "list", toy).output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["list", "nope"], "no target named 'nope'"),
        (["add", "toy", "k", "--title", "t", "--case", "a/*", "--link", "https://x.org/1", "--distribution", "a b"], "distribution"),
        (["remove", "toy", "nope"], "has no known finding 'nope'"),
        (["edit", "toy", "nope", "--title", "x"], "has no known finding 'nope'"),
        (["add", "toy", "k", "--title", "t", "--case", "a b", "--link", "https://x.org/1"], "invalid case glob"),
        (["add", "toy", "k", "--title", "t", "--case", "a/*", "--link", "https://x.org/1", "--versions", "1.0+"], "PEP 440"),
        (["add", "toy", "k", "--title", "t", "--case", "a/*", "--link", "nowhere"], "invalid link"),
    ],
)
def test_bad_input_and_missing_things_exit_2_with_one_line(
    rolled_back_factory: sessionmaker[Session], toy: str, args: list[str], message: str
) -> None:
    result = specwatch(rolled_back_factory, "findings", *args)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output


def test_a_taken_key_exits_2(rolled_back_factory: sessionmaker[Session], toy: str) -> None:
    args = ["findings", "add", toy, "k", "--title", "t", "--case", "a/*", "--link", "https://x.org/1"]
    assert specwatch(rolled_back_factory, *args).exit_code == 0
    again = specwatch(rolled_back_factory, *args)
    assert again.exit_code == 2
    assert "already" in again.output


def test_targets_add_seeds_transformers_and_seed_is_idempotent(rolled_back_factory: sessionmaker[Session]) -> None:
    shipped = shipped_findings("transformers")
    added = specwatch(
        rolled_back_factory, "targets", "add", "transformers", "--repo", "https://github.com/huggingface/transformers",
        "--branch", "main", "--adapter", "transformers", "--install", "source",
    )  # fmt: skip
    assert added.exit_code == 0, added.output
    assert f"{len(shipped)} known finding(s) seeded" in " ".join(added.output.split())
    listed = json.loads(specwatch(rolled_back_factory, "findings", "list", "transformers", "--json").stdout)
    assert [f["key"] for f in listed] == [f.key for f in shipped]

    again = specwatch(rolled_back_factory, "findings", "seed", "transformers")
    assert again.exit_code == 0, again.output
    assert f"0 known finding(s) added, {len(shipped)} already there" in again.output
    assert specwatch(rolled_back_factory, "findings", "remove", "transformers", shipped[0].key).exit_code == 0
    back = json.loads(specwatch(rolled_back_factory, "findings", "seed", "transformers", "--json").stdout)
    assert (back["added"], len(back["kept"])) == ([shipped[0].key], len(shipped) - 1)
    assert len(json.loads(specwatch(rolled_back_factory, "findings", "list", "transformers", "--json").stdout)) == len(shipped)


def test_targets_add_sglang_seeds_its_findings(rolled_back_factory: sessionmaker[Session]) -> None:
    """The service watches SGLang: a pip-installed target (kernels-only on CPU workers, the full release on GPU
    workers: the suite decides) with its two known findings seeded."""
    added = specwatch(
        rolled_back_factory, "targets", "add", "sglang", "--repo", "https://github.com/sgl-project/sglang",
        "--branch", "main", "--adapter", "sglang", "--install", "pip",
    )  # fmt: skip
    assert added.exit_code == 0, added.output
    assert "2 known finding(s) seeded" in " ".join(added.output.split())
    listed = json.loads(specwatch(rolled_back_factory, "findings", "list", "sglang", "--json").stdout)
    assert {f["key"] for f in listed} == {"cpu-xpu-greedy-verification", "chain-residual-underflow-emits-last-token"}


def test_history_says_which_failures_are_known(rolled_back_factory: sessionmaker[Session]) -> None:
    with rolled_back_factory() as session:
        seeded = seed_history(session)  # commits 4 and 5 fail FAILING_CASE; every run recorded library version 0.1
        session.commit()
    before = specwatch(rolled_back_factory, "history", TARGET)
    assert "known)" not in before.output
    args = ["--title", "t", "--case", FAILING_CASE, "--link", "https://x.org/1", "--versions", ">=0.1"]
    assert specwatch(rolled_back_factory, "findings", "add", TARGET, "k", *args).exit_code == 0
    table = specwatch(rolled_back_factory, "history", TARGET)
    assert table.exit_code == 0, table.output
    known = [line for line in table.output.splitlines() if "(all known)" in line]
    assert len(known) == 2
    assert all(any(seeded.shas[order][:12] in line for line in known) for order in (4, 5))
    assert "first failing" not in table.output  # a streak of known failures starts no new one
    page = json.loads(specwatch(rolled_back_factory, "history", TARGET, "--json").stdout)
    by_order = {c["branch_order"]: c for c in page["commits"]}
    assert (by_order[4]["known_failed_cases"], by_order[4]["findings"][0]["key"]) == (1, "k")
    assert by_order[3]["known_failed_cases"] == 0
