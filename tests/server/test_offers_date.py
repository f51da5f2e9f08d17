"""``/gpugeek/offers`` says how old its prices are: the catalog's date, and a warning past a week."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

from gpugeek_jupyter.catalog import fresh

SAMPLE = Path(__file__).parent.parent / "data" / "skypilot-catalog-sample"


async def offers(jp_fetch, **params) -> dict:
    response = await jp_fetch("gpugeek", "offers", params=params)
    assert response.code == 200
    return json.loads(response.body)


async def test_the_bundled_catalog_is_dated(jp_fetch):
    data = await offers(jp_fetch, gpu="H100", limit="3")
    assert data["count"] == 3 and data["prices_as_of"] == "2026-11-21"
    assert "stale_warning" in data
    nothing = await offers(jp_fetch, gpu="H100", count="3")
    assert nothing["offers"] == [] and nothing["prices_as_of"] == "2026-11-21"


async def test_an_update_shows_its_date_and_a_week_later_a_warning(jp_fetch):
    fresh.update(str(SAMPLE), providers=["runpod"])
    fetched = fresh.current().providers["runpod"]["prices_as_of"]
    data = await offers(jp_fetch, provider="runpod", limit="200")
    assert data["count"] == 60, "the updated rows, not the bundled 1393"
    assert data["prices_as_of"] == fetched[:10] and data["stale_warning"] is None

    meta_path = fresh.store() / fresh.META
    meta = json.loads(meta_path.read_text())
    meta["providers"]["runpod"]["prices_as_of"] = (datetime.now(timezone.utc) - timedelta(days=8)).isoformat()
    meta_path.write_text(json.dumps(meta))
    stale = await offers(jp_fetch, provider="runpod", limit="5")
    assert "runpod are 8 days old" in stale["stale_warning"]
    assert "%gpugeek catalog update" in stale["stale_warning"] and "\n" not in stale["stale_warning"]


async def test_residency_keeps_only_the_jurisdictions_offers_and_names_what_it_left_out(jp_fetch):
    data = await offers(jp_fetch, residency="EU", gpu="H100", limit="200")
    from gpugeek_jupyter.catalog.residency import EU_MEMBERS, country_of

    assert data["count"] > 0
    assert all(country_of(o["provider"], o["region"]) in EU_MEMBERS for o in data["offers"])
    assert data["unknown_regions"] == ["runpod/EU-SE-1 (listed under NO, SE)"]
