"""Values between the notebook and the workers: a cell's value and its pulled variables pickled to
go home, and the pushed variables loaded here.

Plain pickle (protocol 5) first: it names each type by its module, so any Python with those
modules loads it — the notebook's may be another minor version than the workers' (a remote
cluster's keeper passes the bytes on untouched). cloudpickle only for what plain pickle cannot
name (a class or function defined in a cell), which only a notebook on the workers' Python loads.

A function or class the notebook defined comes as its source (``cells/pushing.py`` reduces it to
``define``) and is defined again here, in the cell's namespace: it sees the workers' variables.

pandas objects (a DataFrame, a Series, an Index) do not travel as pandas pickles them: a pickle of
pandas 3 names classes and a string dtype that pandas 2 lacks (it fails there, or wants pyarrow),
and the notebook's pandas is often not the hosts' (pandas 3 needs Python 3.11: a host on 3.10 keeps
a pandas 2). They travel in a form of no pandas version's (``neutral``): each column as a numpy
array (or its values, its categories and codes, its mask) with what its dtype is, the index and the
column labels the same way, and ``attrs``; ``rebuilt`` makes the object again with the pandas at
that end. A dtype the form does not know (a period, an interval, a sparse or an Arrow dtype) goes as
pandas pickles it, with the sending pandas' version: another version refuses it in one line
(``plain``), never a failed unpickling.
"""

from __future__ import annotations

import linecache
import pickle
import sys
import threading

from ..errors import GpugeekError

_loading = threading.local()     # the namespace that ``define`` puts what it defines in, while loading


class Pickler(pickle.Pickler):
    """Plain pickle (protocol 5), pandas objects in their neutral form. ``names`` (id of a value →
    its variable's name) lets a refusal on the other end name the variable."""

    def __init__(self, file, names: dict[int, str] | None = None):
        super().__init__(file, protocol=5)
        self.names = names or {}

    def reducer_override(self, obj):
        reduced = pandas_reduced(obj, self.names.get(id(obj)))
        return NotImplemented if reduced is None else reduced


def dumps(value) -> bytes:
    """``value`` as bytes the notebook can load: plain pickle where it can, else cloudpickle."""
    import io

    try:
        if "pandas" not in sys.modules:        # no pandas object can be in it: pickle's own, at C speed
            return pickle.dumps(value, protocol=5)
        buffer = io.BytesIO()
        Pickler(buffer).dump(value)
        return buffer.getvalue()
    except Exception:  # noqa: BLE001 - a class or function of the cell's own: by value
        from ray import cloudpickle

        return cloudpickle.dumps(value, protocol=5)


def load(blob: bytes, namespace: dict) -> dict:
    """The pushed variables, ``{name: value}``; what the notebook defined is defined in ``namespace``."""
    _loading.namespace = namespace
    try:
        return pickle.loads(blob)
    except GpugeekError as exc:        # a pandas object this pandas cannot take (``plain``)
        raise GpugeekError(f"--push {exc}") from None
    finally:
        _loading.namespace = None


def define(name: str, source: str, filename: str):
    """What unpickling a notebook's function or class calls: its source run in the cell's
    namespace (under ``filename``, so a traceback shows its lines), and the object it defined; one
    line naming it when this Python cannot define it (syntax of the notebook's newer Python)."""
    namespace = getattr(_loading, "namespace", None)
    if namespace is None:
        namespace = {"__name__": "__main__"}
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    try:
        code = compile(source, filename, "exec")
    except SyntaxError as exc:     # it compiled in the notebook: the notebook's Python is newer than this one
        minor = ".".join(map(str, sys.version_info[:2]))
        raise GpugeekError(f"{name}: the workers' Python {minor} cannot compile its source ({exc.msg}, line "
                           f"{exc.lineno}: {(exc.text or '').strip()}) — the notebook's Python is newer: write it "
                           f"in Python {minor}'s syntax") from None
    try:
        exec(code, namespace)
    except Exception as exc:  # noqa: BLE001 - its definition's own error (a decorator or default it uses), one line
        raise GpugeekError(f"{name}: defining it on the workers failed ({type(exc).__name__}: {exc}) — push "
                           f"what its definition uses beside it, or define it in the cell") from None
    return namespace[name]


# -- pandas objects, between pandas versions ---------------------------------------------------------

def pandas_reduced(obj, name: str | None = None):
    """How a pickler sends ``obj`` when it is a pandas DataFrame, Series or Index (None: it is not):
    ``rebuilt`` of its neutral form, or ``plain`` of pandas' own pickle where the form does not
    know one of its dtypes."""
    if "pandas" not in sys.modules or not type(obj).__module__.startswith("pandas"):
        return None
    import pandas as pd

    if not isinstance(obj, pd.DataFrame | pd.Series | pd.Index):
        return None
    what = f"{name}: a {type(obj).__name__}" if name else f"a {type(obj).__name__}"
    try:
        return rebuilt, ({**neutral(obj), "pandas": pd.__version__, "what": what},)
    except Exception as exc:  # noqa: BLE001 - _Unknown, or a value the form did not expect: as pandas pickles it
        why = str(exc) if isinstance(exc, _Unknown) else f"values the neutral form cannot take ({exc})"
        return plain, (pd.__version__, pickle.dumps(obj, protocol=5), f"{what} whose {why}")


class _Unknown(Exception):
    """A dtype the neutral form does not carry: what it is, said as 'column 'x' is period[M]'."""


def neutral(obj) -> dict:
    """A DataFrame, Series or Index as builtins and numpy arrays, which any pandas (and numpy) loads."""
    import pandas as pd

    if isinstance(obj, pd.DataFrame):
        return {"kind": "frame", "index": _index(obj.index, "the index"), "columns": _index(obj.columns, "the columns"),
                "data": [_values(obj.iloc[:, i], f"column {obj.columns[i]!r}") for i in range(obj.shape[1])],
                "attrs": dict(obj.attrs)}
    if isinstance(obj, pd.Series):
        return {"kind": "series", "index": _index(obj.index, "the index"), "name": obj.name,
                "data": _values(obj, f"Series {obj.name!r}" if obj.name is not None else "the Series"),
                "attrs": dict(obj.attrs)}
    return {"kind": "index", "index": _index(obj, "the Index")}


def _index(index, where: str) -> dict:
    import pandas as pd

    if isinstance(index, pd.RangeIndex):
        return {"range": (index.start, index.stop, index.step), "name": index.name}
    if isinstance(index, pd.MultiIndex):
        return {"levels": [_index(level, where) for level in index.levels],
                "codes": [codes.copy() for codes in index.codes], "names": list(index.names)}
    out = {"values": _values(index, where), "name": index.name}
    if isinstance(index, pd.DatetimeIndex | pd.TimedeltaIndex) and index.freq is not None:
        out["freq"] = index.freqstr
    return out


def _values(values, where: str) -> tuple:
    """One column's (or an index's) values: ``(kind, ...)`` with a numpy array in it."""
    import numpy as np
    import pandas as pd

    dtype = values.dtype
    if isinstance(dtype, np.dtype):
        return ("numpy", np.asarray(values))            # object columns too: their values as they are
    if isinstance(dtype, pd.StringDtype):
        data = np.array(values.astype(object), dtype=object)
        data[pd.isna(data)] = None
        return ("string", data, dtype.storage, "nan" if dtype.na_value is not pd.NA else "NA")
    if isinstance(dtype, pd.CategoricalDtype):
        cat = pd.Categorical(values)
        return ("category", _index(cat.categories, where), np.asarray(cat.codes), bool(dtype.ordered))
    if isinstance(dtype, pd.DatetimeTZDtype):
        tz = getattr(dtype.tz, "key", None) or getattr(dtype.tz, "zone", None) or \
            ("UTC" if str(dtype.tz) == "UTC" else None)          # zoneinfo's, pytz's, the UTC of either
        if tz is None:
            raise _Unknown(f"{where} is {dtype} (a time zone of no name)")
        local = pd.Series(values).dt.tz_convert("UTC").dt.tz_localize(None)
        return ("tz", np.asarray(local), tz)
    from pandas.api.extensions import ExtensionArray

    array = values.array if hasattr(values, "array") else values
    if type(dtype).__name__ in ("Int8Dtype", "Int16Dtype", "Int32Dtype", "Int64Dtype", "UInt8Dtype",
                                "UInt16Dtype", "UInt32Dtype", "UInt64Dtype", "Float32Dtype", "Float64Dtype",
                                "BooleanDtype") and isinstance(array, ExtensionArray):
        return ("masked", dtype.name, np.asarray(array._data), np.asarray(array._mask))
    raise _Unknown(f"{where} is {dtype}")


def rebuilt(form: dict):
    """The pandas object of a neutral form (``neutral``), made with this end's pandas; one line
    when this pandas cannot make it (never a failed unpickling)."""
    import pandas as pd

    try:
        return _rebuilt(form)
    except Exception as exc:  # noqa: BLE001 - said in one line, with both versions
        raise GpugeekError(f"{form.get('what', 'a pandas object')} sent by pandas {form.get('pandas', '?')} could "
                           f"not be made again by pandas {pd.__version__} ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0] if str(exc) else ''}) — send its columns as numpy arrays, or "
                           f"make it in the cell") from None


def _rebuilt(form: dict):
    import pandas as pd

    if form["kind"] == "index":
        return _index_of(form["index"])
    index = _index_of(form["index"])
    if form["kind"] == "series":
        values = _array_of(form["data"])
        out = pd.Series(values, index=index, name=form["name"], dtype=_dtype(values), copy=False)
    else:
        columns = _index_of(form["columns"])
        out = pd.DataFrame({i: pd.Series(v, dtype=_dtype(v), copy=False)
                            for i, v in enumerate(map(_array_of, form["data"]))})
        if not form["data"]:
            out = pd.DataFrame(index=range(len(index)))
        out.index, out.columns = index, columns
    out.attrs.update(form["attrs"])
    return out


def _index_of(form: dict):
    import pandas as pd

    if "range" in form:
        return pd.RangeIndex(*form["range"], name=form["name"])
    if "levels" in form:
        return pd.MultiIndex(levels=[_index_of(level) for level in form["levels"]], codes=form["codes"],
                             names=form["names"])
    values = _array_of(form["values"])
    index = pd.Index(values, name=form["name"], dtype=_dtype(values), copy=False)
    if form.get("freq"):
        try:
            index.freq = form["freq"]
        except (ValueError, TypeError, AttributeError):   # a spelling this pandas does not know: no freq
            pass
    return index


def _dtype(values):
    """The dtype to build with: a numpy array's own (given, so that pandas infers nothing)."""
    import numpy as np

    return values.dtype if isinstance(values, np.ndarray) else None


def _array_of(form: tuple):
    """A column's values for this pandas, from ``_values``."""
    import pandas as pd

    kind = form[0]
    if kind == "numpy":      # as it is: objects stay objects (pandas 3 would make strings ``str``)
        return form[1]
    if kind == "string":
        _, data, storage, na = form
        return pd.array(data, dtype=_string_dtype(storage, na))
    if kind == "category":
        _, categories, codes, ordered = form
        return pd.Categorical.from_codes(codes, dtype=pd.CategoricalDtype(_index_of(categories), ordered=ordered))
    if kind == "tz":
        return pd.array(pd.DatetimeIndex(form[1]).tz_localize("UTC").tz_convert(form[2]))
    _, name, data, mask = form
    values = data.astype(object)
    values[mask] = None
    return pd.array(values, dtype=name)


def _string_dtype(storage: str, na: str):
    """This pandas' string dtype for one sent as ``storage`` with ``na`` missing values: pandas' own
    default string dtype (``str``, NaN for missing) as this end's default, whatever its storage;
    ``string`` (pd.NA) in the same storage where this end has it. A pandas without the NaN string
    dtype (before 2.3) keeps such a column as objects, as it keeps strings."""
    import numpy as np
    import pandas as pd

    if na == "nan":
        try:
            return pd.StringDtype(na_value=np.nan)
        except TypeError:
            return object
    if storage == "pyarrow":
        try:
            import pyarrow  # noqa: F401

            return pd.StringDtype("pyarrow")
        except ImportError:
            pass
    return pd.StringDtype("python")


def plain(version: str, blob: bytes, what: str):
    """pandas' own pickle of an object whose dtype the neutral form does not carry: loaded by the
    pandas that made it; another refuses it in one line."""
    import pandas as pd

    if pd.__version__ != version:
        raise GpugeekError(f"{what}, which pandas {version} cannot send to pandas {pd.__version__} "
                           f"intact — convert it first (df.astype(str), or plain numpy arrays), or make it "
                           f"in the cell")
    return pickle.loads(blob)
