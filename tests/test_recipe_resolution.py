"""Every recipe resolves to the config recorded in tests/fixtures/resolved_recipes.json (first written from the code
before the run-key redesign): moving code or deleting restated keys must not change what any recipe trains. An
intended change regenerates the file (tests/fixtures/make_resolved_recipes.py) in the same commit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RECORDED = json.loads((REPO / "tests" / "fixtures" / "resolved_recipes.json").read_text())


def test_every_recipe_is_recorded():
    assert sorted(RECORDED) == sorted(str(p.relative_to(REPO)) for p in (REPO / "config" / "recipes").glob("*/*.yaml"))


@pytest.mark.parametrize("recipe", sorted(RECORDED))
def test_recipe_resolves_as_recorded(recipe, monkeypatch):
    from xmr.run.config import load_run_config

    monkeypatch.chdir(REPO)
    got = json.loads(json.dumps(load_run_config(recipe), default=str))
    want = RECORDED[recipe]
    diff = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
    assert got == want, f"{recipe}: sections differ: {diff}; if intended, run tests/fixtures/make_resolved_recipes.py"
