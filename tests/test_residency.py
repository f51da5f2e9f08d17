"""Data residency: every region of the bundled catalog sits in a known country, and a
jurisdiction keeps exactly the offers whose country it holds — unknown regions are left out."""

from __future__ import annotations

import csv
import re
import time
from importlib import resources
from pathlib import Path

import pandas as pd
import pytest

from gpugeek_jupyter.catalog import load_catalog
from gpugeek_jupyter.catalog.offers import bundled_catalog_path
from gpugeek_jupyter.catalog.residency import (
    APAC,
    EU_MEMBERS,
    ISO_COUNTRIES,
    JURISDICTIONS,
    TABLE_COLUMNS,
    countries_in,
    country_of,
    regions_table_path,
    residency_mask,
    unknown_regions,
)
from gpugeek_jupyter.errors import GpugeekError

ROOT = Path(__file__).parent.parent


def kept(catalog: pd.DataFrame, residency: str) -> set[str]:
    mask, _unknown = residency_mask(catalog, residency)
    rows = catalog[mask]
    return set(rows["provider"] + "/" + rows["region"])


def test_every_region_of_the_bundled_catalog_has_a_country():
    """The goal is none unknown; a region listed here needs a sourced row in regions.csv."""
    assert unknown_regions(load_catalog()) == []


def test_eu_keeps_only_regions_in_eu_member_states():
    catalog = load_catalog()
    mask, unknown = residency_mask(catalog, "EU")
    # the catalog lists RunPod's EU-SE-1 under Norway and Sweden: it may lie outside the EU
    assert unknown == ["runpod/EU-SE-1 (listed under NO, SE)"]
    assert mask.index.equals(catalog.index) and mask.dtype == bool
    countries = [country_of(row.provider, row.region, row.zone) for row in catalog.itertuples()]
    doubtful = (catalog["provider"] == "runpod") & (catalog["zone"] == "EU-SE-1")
    assert doubtful.sum() > 0 and not mask[doubtful].any()
    for inside, country, unsure in zip(mask, countries, doubtful, strict=True):
        if not unsure:
            assert inside == (country in EU_MEMBERS), country
    regions = kept(catalog, "EU")
    assert {"aws/eu-west-1", "gcp/europe-west4", "aws/eu-central-1", "nebius/eu-north1",
            "lambda/europe-central-1", "runpod/NL", "vast/Slovenia, SI, EU"} <= regions
    # … while the EEA holds both countries, so there it stays
    eea, unknown = residency_mask(catalog, "EEA")
    assert unknown == [] and eea[doubtful].all()
    assert not {"aws/us-east-1", "gcp/us-central1", "azure/eastus", "runpod/US"} & regions
    # Vast's third field is a continent: St Petersburg says "EU" but is in Russia
    assert "vast/St.-Petersburg, RU, EU" not in regions


def test_known_regions_map_to_their_countries():
    assert country_of("aws", "eu-west-1") == "IE"
    assert country_of("gcp", "europe-west4") == "NL"
    assert country_of("aws", "us-east-1") == "US"
    assert country_of("azure", "westus3") == "US"
    assert country_of("gcp", "europe-west6") == "CH"
    assert country_of("AWS", "EU-WEST-1") == "IE", "provider and region names are case-insensitive"


def test_uk_is_not_eu():
    catalog = load_catalog()
    uk, eu = kept(catalog, "UK"), kept(catalog, "EU")
    assert uk == {"aws/eu-west-2", "gcp/europe-west2"}
    assert not uk & eu
    assert "GB" not in EU_MEMBERS and countries_in("uk") == countries_in("GB") == {"GB"}


def test_eea_is_eu_plus_iceland_liechtenstein_norway():
    assert countries_in("EEA") == EU_MEMBERS | {"IS", "LI", "NO"}
    assert len(EU_MEMBERS) == 27
    regions = kept(load_catalog(), "EEA")
    assert {"runpod/IS", "runpod/NO", "vast/Norway, NO, EU"} <= regions
    assert "runpod/NO" not in kept(load_catalog(), "EU")


def test_jurisdictions_are_case_insensitive_and_country_codes_are_their_own():
    catalog = load_catalog()
    assert kept(catalog, "eu") == kept(catalog, " EU ")
    germany = kept(catalog, "de")
    assert germany == {"aws/eu-central-1", "gcp/europe-west3", "lambda/europe-central-1", "vast/Germany, DE, EU"}
    assert kept(catalog, "JP") <= kept(catalog, "apac")
    assert countries_in("ch") == {"CH"} and countries_in("us") == {"US"} and countries_in("Ca") == {"CA"}
    assert APAC <= ISO_COUNTRIES and all(c <= ISO_COUNTRIES for c in JURISDICTIONS.values())


@pytest.mark.parametrize("name", ["Atlantis", "XX", "", None, "EL"])
def test_an_unknown_jurisdiction_is_one_line_listing_the_known(name):
    with pytest.raises(GpugeekError) as err:
        residency_mask(load_catalog(), name)
    message = str(err.value)
    assert "\n" not in message
    for known in JURISDICTIONS:
        assert known in message


def test_unknown_regions_are_left_out_and_named():
    catalog = pd.DataFrame({
        "provider": ["aws", "aws", "acme", "runpod", "vast", "vast"],
        "region": ["eu-west-1", "eu-mars-1", "eu-west-1", "XX", "Nowhere", "Berlin, DE, EU"],
        "zone": ["", "", "", "XX-1", "", ""],
    }, index=[10, 11, 12, 13, 14, 15])
    mask, unknown = residency_mask(catalog, "EU")
    assert list(mask) == [True, False, False, False, False, True]
    assert list(mask.index) == [10, 11, 12, 13, 14, 15]
    assert unknown == ["acme/eu-west-1", "aws/eu-mars-1", "runpod/XX", "vast/Nowhere"]
    assert unknown_regions(catalog) == unknown
    empty_mask, empty_unknown = residency_mask(catalog.iloc[:0], "EU")
    assert empty_mask.empty and empty_unknown == []


def test_rules_for_runpod_and_vast_read_a_real_iso_code():
    assert country_of("runpod", "SE", "EU-SE-1") == "SE"
    assert country_of("runpod", "se") == "SE"
    assert country_of("runpod", "UK") is None, "UK is no ISO 3166-1 code (GB is)"
    assert country_of("vast", ", US, NA") == "US"
    assert country_of("vast", "British Columbia, CA, NA") == "CA"
    assert country_of("vast", "St.-Petersburg, RU, EU") == "RU"
    assert country_of("vast", "Somewhere, ZZ, EU") is None
    assert country_of("vast", "Germany") is None


def test_regions_csv_is_well_formed():
    with regions_table_path().open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        assert tuple(reader.fieldnames) == TABLE_COLUMNS
        rows = list(reader)
    assert rows
    seen = set()
    for row in rows:
        key = (row["provider"], row["region"])
        assert key not in seen, key
        seen.add(key)
        assert row["provider"] == row["provider"].strip().lower() and row["region"].strip() == row["region"] != ""
        assert row["country"] in ISO_COUNTRIES, row
        assert row["location"].strip(), row
        assert re.fullmatch(r"https?://\S+", row["source"]), row
    # RunPod and Vast are read by rule, not rows
    assert not {p for p, _r in seen} & {"runpod", "vast"}


def test_iso_list_is_the_tz_databases():
    tzdata = pytest.importorskip("tzdata")
    table = resources.files(tzdata).joinpath("zoneinfo", "iso3166.tab").read_text(encoding="utf-8")
    codes = {line.split("\t")[0] for line in table.splitlines() if line and not line.startswith("#")}
    assert codes == ISO_COUNTRIES


def test_the_mask_is_fast_over_the_whole_catalog():
    catalog = load_catalog()
    residency_mask(catalog, "EU")          # warm the per-region cache
    best = min(_timed(lambda: residency_mask(catalog, "EU")) for _ in range(5))
    assert best < 0.010, f"{best * 1e3:.1f} ms"


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def test_the_table_ships_in_the_package():
    """Found the way the bundled catalog is, and inside the package the wheel packs whole."""
    path = regions_table_path()
    assert path.is_file()
    assert path.parent == bundled_catalog_path().parent
    packaged = resources.files("gpugeek_jupyter.catalog").joinpath("data", "regions.csv")
    assert packaged.is_file()
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wheel = project["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert wheel["packages"] == ["gpugeek_jupyter"]
    assert not wheel.get("exclude") and not wheel.get("only-include")
    # hatchling packs every file of the package that .gitignore does not exclude
    pathspec = pytest.importorskip("pathspec")
    ignore = pathspec.GitIgnoreSpec.from_lines((ROOT / ".gitignore").read_text().splitlines())
    assert not ignore.match_file("gpugeek_jupyter/catalog/data/regions.csv")
    assert ignore.match_file("gpugeek_jupyter/labextension/package.json"), "the check can see an excluded file"


def test_the_picker_and_plan_keep_to_the_residency():
    from gpugeek_jupyter import plan
    from gpugeek_jupyter.widgets import OfferPicker

    picker = OfferPicker(gpu="H100", residency="eu")
    assert picker.residency.value == "EU"
    assert all(country_of(p, r) in EU_MEMBERS for p, r in zip(picker.offers["provider"], picker.offers["region"],
                                                                strict=True))
    assert "left out 1 region(s) of unknown location" in picker.count_label.value
    picker.residency.value = "US"
    assert set(country_of(p, r) for p, r in zip(picker.offers["provider"], picker.offers["region"],
                                                 strict=True)) == {"US"}
    table = plan(params="7B", gpus=8, strategy="fsdp", residency="UK").table
    assert not table.empty
    assert {country_of(p, r) for p, r in zip(table["provider"], table["id"].str.split("/").str[2],
                                             strict=True)} == {"GB"}


def test_a_doubtful_data_centre_is_named_only_where_it_might_lie():
    catalog = load_catalog()
    assert residency_mask(catalog, "US")[1] == []          # Norway or Sweden: never the US
    assert residency_mask(catalog, "NO")[1] == ["runpod/EU-SE-1 (listed under NO, SE)"]
