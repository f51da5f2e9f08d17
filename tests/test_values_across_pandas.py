"""pandas objects between a notebook and workers whose pandas differ (pandas 3 here, pandas 2 on
hosts whose Python is 3.10): pushed and pulled in a form of no pandas version's
(``workers/values.py``), made again with the pandas at the other end; a dtype the form does not
carry is refused in one line, naming the variable and both versions, never a failed unpickling.

Measured (pandas 3.1.1 against 2.3.3, plain pickle protocol 5, a frame of int, float and string
columns with a default index): pandas 3's pickle fails in pandas 2 — ``No module named 'pyarrow'``
without pyarrow, ``NotImplementedError`` from ``NDArrayBacked.__setstate__`` for a string column of
python storage; pandas 2's loads in pandas 3 (its strings stay objects)."""

from __future__ import annotations

import io
import pickle
import pickletools
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpugeek_jupyter.cells import pushing
from gpugeek_jupyter.errors import GpugeekError
from gpugeek_jupyter.group.results import _pulled
from gpugeek_jupyter.workers import values

ROOT = Path(__file__).resolve().parent.parent


def frames() -> dict:
    return {
        "plain": pd.DataFrame({"i": [1, 2, 3], "f": [0.5, 1.5, np.nan], "s": ["a", "b", None]}),
        "typed": pd.DataFrame({"I": pd.array([1, None, 3], dtype="Int64"), "b": [True, False, True],
                               "B": pd.array([True, None, False], dtype="boolean"),
                               "c": pd.Categorical(["x", "y", "x"], ordered=True),
                               "t": pd.date_range("2024-01-01", periods=3, tz="Europe/Paris"),
                               "n": pd.to_datetime(["2024-01-01", None, "2024-03-01"]),
                               "d": pd.to_timedelta([1, 2, 3], unit="s"),
                               "o": pd.Series([1, "a", None], dtype=object),
                               "S": pd.array(["p", None, "q"], dtype="string")},
                              index=pd.Index(["r1", "r2", "r3"], name="row")),
        "multi": pd.DataFrame({("a", 1): [1.0, 2.0], ("b", 2): [3, 4]},
                              index=pd.MultiIndex.from_tuples([("x", 1), ("y", 2)], names=["k", "j"])),
        "duplicate columns": pd.DataFrame([[1, 2.5], [3, 4.5]], columns=["x", "x"]),
        "dated": pd.DataFrame({"v": [1.5, 2.5, 3.5]}, index=pd.date_range("2024-01-01", periods=3, freq="D")),
        "empty": pd.DataFrame(index=pd.RangeIndex(2, 8, 3)),
        "no rows": pd.DataFrame({"i": pd.Series([], dtype="int64"), "s": pd.Series([], dtype=object)}),
    }


def modules_in(blob: bytes) -> set[str]:
    """The modules a pickle's globals come from (what unpickling it imports)."""
    found, strings = set(), []
    for op, arg, _ in pickletools.genops(blob):
        if isinstance(arg, str) and "UNICODE" in op.name:
            strings.append(arg)
        elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
            found.add(strings[-2])
        elif op.name in ("GLOBAL", "INST"):
            found.add(arg.split(" ")[0])
    return found


def pandas_named(blob: bytes) -> list[str]:
    return [m for m in modules_in(blob) if m.split(".")[0] in ("pandas", "pyarrow")]


@pytest.mark.parametrize("name", list(frames()))
def test_a_frame_pulled_arrives_as_it_was_and_names_no_pandas_class(name):
    frame = frames()[name]
    frame.attrs["source"] = "cell 3"
    blob = values.dumps(frame)
    assert not pandas_named(blob), modules_in(blob)
    got = _pulled("df", blob)
    pd.testing.assert_frame_equal(got, frame, check_freq=True)
    assert got.attrs == {"source": "cell 3"}


def test_series_and_an_index_pushed_arrive_as_they_were_nested_too():
    series = pd.Series([1.5, None, 3.0], name="v", index=pd.Index([10, 20, 30], name="at"))
    index = pd.Index(["a", "b"], name="letters")
    blob = pushing.dumps({"s": series, "i": index, "both": {"frames": [frames()["plain"]]}})
    assert not pandas_named(blob), modules_in(blob)
    assert "gpugeek_jupyter.workers.values" in modules_in(blob)
    got = values.load(blob, {})
    pd.testing.assert_series_equal(got["s"], series)
    pd.testing.assert_index_equal(got["i"], index)
    pd.testing.assert_frame_equal(got["both"]["frames"][0], frames()["plain"])


def test_a_string_column_takes_the_other_ends_string_dtype():
    """pandas 3's default ``str`` (NaN for missing) becomes the default string dtype at the other
    end whatever its storage (pandas 2.3's python one where it has no pyarrow): back here it is ours."""
    form = values.neutral(pd.DataFrame({"s": ["a", None]}))
    kind, data, _storage, na = form["data"][0]
    assert (kind, na, list(data)) == ("string", "nan", ["a", None]) and data.dtype == object
    assert values.rebuilt(form)["s"].dtype == pd.DataFrame({"s": ["a", None]})["s"].dtype


def test_a_dtype_the_form_lacks_is_refused_in_one_line_by_another_pandas(monkeypatch):
    periods = pd.DataFrame({"p": pd.period_range("2024-01", periods=2, freq="M")})
    pushed = pushing.dumps({"months": periods})
    pulled = values.dumps(periods)
    got = values.load(pushed, {})["months"]          # the same pandas: as pandas pickles it
    pd.testing.assert_frame_equal(got, periods)
    mine = pd.__version__
    monkeypatch.setattr(pd, "__version__", "2.3.3")
    with pytest.raises(GpugeekError) as push:
        values.load(pushed, {})
    with pytest.raises(GpugeekError) as pull:
        _pulled("months", pulled)
    for said in (str(push.value), str(pull.value)):
        assert "\n" not in said and "months" in said and mine in said and "2.3.3" in said and "period[M]" in said, said
        assert "convert it" in said
    assert str(push.value).startswith("--push months: a DataFrame whose column 'p' is period[M]")
    assert str(pull.value).startswith("--pull months: a DataFrame whose column 'p' is period[M]")


LOAD = """
import pickle, sys
import pandas as pd
from gpugeek_jupyter.workers import values
got = pickle.loads(sys.stdin.buffer.read())
sys.stdout.buffer.write(values.dumps({"version": pd.__version__, "got": got,
                                      "kinds": {k: str(v) for k, v in got.dtypes.items()}}))
"""


@pytest.mark.slow
def test_pandas_3_and_pandas_2_read_each_others_frames(tmp_path):
    """The real thing, where a venv of pandas 2.3.3 can be made here (uv, from pip's sources): a
    pandas 3 frame read there, and what pandas 2 sends back read here, equal."""
    uv = Path(sys.executable).parent / "uv"
    if not uv.exists() or shutil.which("python3") is None:
        pytest.skip("no uv in this venv to make a pandas 2 venv with")
    venv = tmp_path / "p2"
    sources = subprocess.run([sys.executable, str(ROOT / "tests" / "uv_sources.py")], capture_output=True,
                             text=True).stdout.split()
    made = subprocess.run([str(uv), "venv", "-q", "--python", sys.executable, str(venv)], capture_output=True)
    if made.returncode == 0:
        made = subprocess.run([str(uv), "pip", "install", "-q", "--python", str(venv / "bin" / "python"), *sources,
                               "pandas==2.3.3", "numpy"], capture_output=True, text=True, timeout=300)
    if made.returncode != 0:
        pytest.skip(f"no pandas 2.3.3 venv could be made here: {made.stderr.strip()[-300:]}")
    frame = frames()["plain"]
    assert frame["s"].dtype == "str"          # pandas 3's own string dtype: what pandas 2's pickle lacks
    done = subprocess.run([str(venv / "bin" / "python"), "-c", LOAD], input=values.dumps(frame), capture_output=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin"}, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    back = pickle.load(io.BytesIO(done.stdout))
    assert back["version"] == "2.3.3" and back["kinds"]["s"] in ("str", "string"), back["kinds"]
    pd.testing.assert_frame_equal(back["got"], frame)


def test_a_form_this_pandas_cannot_make_again_is_refused_in_one_line():
    """A time zone the other end lacks, say: one line with both versions, not a failed unpickling."""
    frame = pd.DataFrame({"t": pd.date_range("2024-01-01", periods=2, tz="UTC")})
    blob = pushing.dumps({"when": frame}).replace(b"\x03UTC", b"\x03Zzz")    # as if its name were unknown here
    with pytest.raises(GpugeekError) as refused:
        values.load(blob, {})
    said = str(refused.value)
    assert said.startswith("--push when: a DataFrame sent by pandas") and "\n" not in said, said
    assert said.count(pd.__version__) == 2 and "could not be made again" in said


def test_a_time_zone_of_no_name_goes_as_pandas_pickles_it():
    import datetime

    offset = datetime.timezone(datetime.timedelta(hours=1))
    frame = pd.DataFrame({"t": pd.date_range("2024-01-01", periods=2, tz=offset)})
    blob = values.dumps(frame)
    assert b"\x05plain" in blob and b"rebuilt" not in blob      # pandas' own pickle, with its version
    pd.testing.assert_frame_equal(_pulled("t", blob), frame)
