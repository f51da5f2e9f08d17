"""Data residency: the country an offer's region is in, and which offers a jurisdiction keeps.

Where a region is comes from ``data/regions.csv``: one row per (provider, region) with its
ISO 3166-1 alpha-2 country and the page that says where the region is (the provider's own
documentation; for Lambda, whose docs do not list it, an open-source SDK that records Lambda's
region names and countries). Two providers
carry the country in the catalog itself, so a rule reads it there instead of a row:

- RunPod: the region *is* the country code (``SE``); the zone is the data centre. A data centre
  the catalog lists under two countries (EU-SE-1 under both ``NO`` and ``SE``) is kept only by a
  jurisdiction holding both; any other leaves it out and names it.
- Vast: the region is ``"place, CC, continent"`` (``"Slovenia, SI, EU"``, ``", US, NA"``); the
  second field is the country code. The third field is a continent: ``EU`` there means Europe,
  not the European Union (``"St.-Petersburg, RU, EU"`` is in Russia).

Either way the code must be a real ISO country code. A region none of this can place is
*unknown*: a residency filter leaves its offers out and names it, it never guesses.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import GpugeekError


def _codes(text: str) -> frozenset[str]:
    return frozenset(text.split())


# ISO 3166-1 alpha-2: every officially assigned code (249), as listed in the tz database's
# iso3166.tab. tests/test_residency.py checks this list against that file.
ISO_COUNTRIES = _codes("""
AD AE AF AG AI AL AM AO AQ AR AS AT AU AW AX AZ BA BB BD BE BF BG BH BI BJ BL BM BN BO BQ BR BS
BT BV BW BY BZ CA CC CD CF CG CH CI CK CL CM CN CO CR CU CV CW CX CY CZ DE DJ DK DM DO DZ EC EE
EG EH ER ES ET FI FJ FK FM FO FR GA GB GD GE GF GG GH GI GL GM GN GP GQ GR GS GT GU GW GY HK HM
HN HR HT HU ID IE IL IM IN IO IQ IR IS IT JE JM JO JP KE KG KH KI KM KN KP KR KW KY KZ LA LB LC
LI LK LR LS LT LU LV LY MA MC MD ME MF MG MH MK ML MM MN MO MP MQ MR MS MT MU MV MW MX MY MZ NA
NC NE NF NG NI NL NO NP NR NU NZ OM PA PE PF PG PH PK PL PM PN PR PS PT PW PY QA RE RO RS RU RW
SA SB SC SD SE SG SH SI SJ SK SL SM SN SO SR SS ST SV SX SY SZ TC TD TF TG TH TJ TK TL TM TN TO
TR TT TV TW TZ UA UG UM US UY UZ VA VC VE VG VI VN VU WF WS YE YT ZA ZM ZW
""")

# The 27 EU member states, as Eurostat lists them ("Glossary: European Union (EU)",
# https://ec.europa.eu/eurostat/statistics-explained/index.php?title=Glossary:European_Union_(EU)).
# Eurostat writes Greece as EL; its ISO code is GR.
EU_MEMBERS = _codes("""
AT BE BG HR CY CZ DK EE FI FR DE GR HU IE IT LV LT LU MT NL PL PT RO SK SI ES SE
""")

# Asia-Pacific as this project means it: East, South-East and South Asia and Oceania. "APAC" is
# no legal area; check this list against the rule you must follow.
APAC = _codes("""
AU BD BN BT CN FJ HK ID IN JP KH KR LA LK MM MN MO MV MY NP NZ PG PH PK SG TH TL TW VN
""")

# Named jurisdictions (case-insensitive). Any ISO country code (DE, JP) is also its own one.
# The EEA is the EU plus Iceland, Liechtenstein and Norway (the EEA Agreement).
JURISDICTIONS: dict[str, frozenset[str]] = {
    "EU": EU_MEMBERS,
    "EEA": EU_MEMBERS | {"IS", "LI", "NO"},
    "UK": frozenset({"GB"}),
    "US": frozenset({"US"}),
    "CA": frozenset({"CA"}),
    "CH": frozenset({"CH"}),
    "APAC": APAC,
}

TABLE_COLUMNS = ("provider", "region", "country", "location", "source")


def regions_table_path() -> Path:
    return Path(str(resources.files(__package__).joinpath("data", "regions.csv")))


@lru_cache(maxsize=1)
def region_table() -> dict[tuple[str, str], str]:
    """(provider, region) → country, read once; a malformed row names its line."""
    path = regions_table_path()
    table: dict[tuple[str, str], str] = {}
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        if tuple(reader.fieldnames or ()) != TABLE_COLUMNS:
            raise GpugeekError(f"{path}:1: the columns are not the table's — make its first line "
                               f"{','.join(TABLE_COLUMNS)}")
        for row in reader:
            key = (row["provider"].strip().lower(), row["region"].strip().lower())
            country = row["country"].strip()
            if country not in ISO_COUNTRIES:
                raise GpugeekError(f"{path}:{reader.line_num}: {country!r} is not an ISO country code — write its two "
                                   "letters, like DE")
            if key in table:
                raise GpugeekError(f"{path}:{reader.line_num}: {key[0]}/{key[1]} is listed twice — keep one of its "
                                   "lines")
            table[key] = country
    return table


def _iso(code: str) -> str | None:
    code = code.strip().upper()
    return code if code in ISO_COUNTRIES else None


@lru_cache(maxsize=4096)
def country_of(provider: str, region: str, zone: str = "") -> str | None:
    """The ISO country code of a region, or None when nothing says where it is.

    ``zone`` is accepted so a catalog row can be passed as it is; no country is read from it
    (RunPod's zone is a data centre, and its region already names the country).
    """
    provider = str(provider).strip().lower()
    region = str(region)
    if provider == "runpod":
        return _iso(region)
    if provider == "vast":
        parts = region.split(",")
        return _iso(parts[1]) if len(parts) == 3 else None
    return region_table().get((provider, region.strip().lower()))


def countries_in(residency: str) -> frozenset[str]:
    """The country codes a jurisdiction holds; an unknown name is one line listing the known."""
    name = str(residency).strip().upper() if residency is not None else ""
    if name in JURISDICTIONS:
        return JURISDICTIONS[name]
    if name in ISO_COUNTRIES:
        return frozenset({name})
    raise GpugeekError(
        f"unknown residency {residency!r} — use one of {', '.join(JURISDICTIONS)} "
        f"or a two-letter ISO country code such as DE or JP"
    )


def _countries(catalog: pd.DataFrame) -> tuple[np.ndarray, list[tuple[str, str]], list[str | None]]:
    """Each row's index into the unique (provider, region) pairs, the pairs, their countries.

    Looks each pair up once: the catalog has thousands of rows but only about a hundred regions.
    """
    pairs = pd.MultiIndex.from_arrays([catalog["provider"].astype(str), catalog["region"].astype(str)])
    codes, uniques = pairs.factorize()
    keys = list(uniques)
    return codes, keys, [country_of(provider, region) for provider, region in keys]


def _unknown(keys: Iterable[tuple[str, str]], countries: Iterable[str | None]) -> list[str]:
    return sorted(f"{provider}/{region}" for (provider, region), country in zip(keys, countries, strict=True)
                  if country is None)


_recent: dict[tuple[int, frozenset], tuple[pd.DataFrame, tuple[pd.Series, list[str]]]] = {}


def residency_mask(catalog: pd.DataFrame, residency: str) -> tuple[pd.Series, list[str]]:
    """Offers whose region lies in the jurisdiction, and the ``provider/region`` nobody can place.

    Offers in unknown regions are left out of the mask, never guessed in. The answer for the
    last few frames is kept (with the frame, so its id cannot be reused): planning asks often.
    """
    allowed = countries_in(residency)
    key = (id(catalog), allowed)
    if key in _recent and _recent[key][0] is catalog:
        return _recent[key][1]
    if len(_recent) >= 8:
        _recent.clear()
    _recent[key] = (catalog, _mask(catalog, allowed))
    return _recent[key][1]


def _mask(catalog: pd.DataFrame, allowed: frozenset[str]) -> tuple[pd.Series, list[str]]:
    if catalog.empty:
        return pd.Series(False, index=catalog.index, dtype=bool), []
    codes, keys, countries = _countries(catalog)
    inside = np.fromiter((country in allowed for country in countries), dtype=bool, count=len(countries))
    mask = pd.Series(inside[codes], index=catalog.index)
    places = []
    for zone, listed in _doubtful_data_centres(catalog).items():
        codes = {_iso(code) for code in listed}
        if not codes <= allowed:        # it may lie outside: leave it out
            mask &= ~((catalog["provider"] == "runpod") & (catalog["zone"] == zone))
            if codes & allowed:         # … and say so where it may also lie inside
                places.append(f"runpod/{zone} (listed under {', '.join(sorted(listed))})")
    return mask, _unknown(keys, countries) + sorted(places)


def _doubtful_data_centres(catalog: pd.DataFrame) -> dict[str, set[str]]:
    """RunPod data centres the catalog lists under more than one country (EU-SE-1 under both NO
    and SE), with those countries: which one holds it cannot be told from the catalog."""
    if "zone" not in catalog:
        return {}
    rows = catalog[catalog["provider"] == "runpod"]
    listed = {zone: set(group) for zone, group in rows.groupby("zone")["region"]}
    return {zone: regions for zone, regions in listed.items() if len(regions) > 1}


def unknown_regions(catalog: pd.DataFrame) -> list[str]:
    """``provider/region`` of the catalog that no table row or rule places in a country."""
    if catalog.empty:
        return []
    _rows, keys, countries = _countries(catalog)
    return _unknown(keys, countries)
