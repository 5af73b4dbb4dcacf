"""Can data written with schema W be read with schema R? (Avro schema resolution rules.)

``incompatibilities(writer, reader)`` lists the problems as readable strings, each naming the
field path; an empty list means every value written with W resolves to R.
"""

from __future__ import annotations

from typing import Any

__all__ = ["incompatibilities"]

_PROMOTIONS = {
    "int": {"int", "long", "float", "double"},
    "long": {"long", "float", "double"},
    "float": {"float", "double"},
    "double": {"double"},
    "string": {"string", "bytes"},
    "bytes": {"bytes", "string"},
}


def _names(schema: Any, table: dict[str, Any], namespace: str = "") -> None:
    if isinstance(schema, list):
        for s in schema:
            _names(s, table, namespace)
        return
    if not isinstance(schema, dict):
        return
    kind = schema.get("type")
    if kind in ("record", "enum", "fixed", "error"):
        name = schema["name"]
        full = name if "." in name else (f"{schema.get('namespace', namespace)}.{name}".strip("."))
        table[full] = schema
        ns = full.rpartition(".")[0]
        for f in schema.get("fields", ()):
            _names(f["type"], table, ns)
    elif kind == "array":
        _names(schema["items"], table, namespace)
    elif kind == "map":
        _names(schema["values"], table, namespace)
    elif isinstance(kind, (dict, list)):
        _names(kind, table, namespace)


def _deref(schema: Any, table: dict[str, Any]) -> Any:
    while True:
        if isinstance(schema, str) and schema in table:
            schema = table[schema]
        elif isinstance(schema, dict) and isinstance(schema.get("type"), (dict, list)):
            schema = schema["type"]
        elif isinstance(schema, dict) and isinstance(schema.get("type"), str) and schema["type"] in table:
            schema = table[schema["type"]]
        else:
            return schema


def _kind(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, dict):
        return str(schema["type"])
    return str(schema)


def incompatibilities(writer: Any, reader: Any) -> list[str]:
    """Problems reading data written with ``writer`` using ``reader`` (empty: compatible)."""
    wt: dict[str, Any] = {}
    rt: dict[str, Any] = {}
    _names(writer, wt)
    _names(reader, rt)
    problems: list[str] = []
    root = reader.get("cqrs.type", reader.get("name", "")) if isinstance(reader, dict) else ""
    _check(writer, reader, wt, rt, str(root), problems, set())
    return problems


def _matches(w: Any, r: Any, wt: dict[str, Any], rt: dict[str, Any]) -> bool:
    probe: list[str] = []
    _check(w, r, wt, rt, "", probe, set())
    return not probe


def _check(
    w: Any, r: Any, wt: dict[str, Any], rt: dict[str, Any], path: str, out: list[str], seen: set[tuple[int, int]]
) -> None:
    w, r = _deref(w, wt), _deref(r, rt)
    wk, rk = _kind(w), _kind(r)
    if wk == "record":
        key = (id(w), id(r))
        if key in seen:  # recursive types
            return
        seen.add(key)
    if wk == "union":
        for branch in w:
            if rk == "union":
                if not any(_matches(branch, rb, wt, rt) for rb in r):
                    out.append(f"{path}: stored values of type {_kind(_deref(branch, wt))} fit no branch of the new union")
            else:
                _check(branch, r, wt, rt, path, out, seen)
        return
    if rk == "union":
        if not any(_matches(w, rb, wt, rt) for rb in r):
            out.append(f"{path}: stored type {wk} fits no branch of the new union")
        return
    if wk in _PROMOTIONS or rk in _PROMOTIONS or wk in ("boolean", "null"):
        if wk == rk or rk in _PROMOTIONS.get(wk, ()):
            return
        out.append(f"{path}: type changed from {wk} to {rk}, which Avro cannot promote")
        return
    if wk != rk:
        out.append(f"{path}: type changed from {wk} to {rk}")
        return
    if wk == "record":
        wname, rname = w["name"].rpartition(".")[2], r["name"].rpartition(".")[2]
        if wname != rname and wname not in [a.rpartition(".")[2] for a in r.get("aliases", ())]:
            out.append(f"{path}: record name changed from {w['name']} to {r['name']}")
            return
        wfields = {f["name"]: f for f in w["fields"]}
        for rf in r["fields"]:
            fpath = f"{path}.{rf['name']}"
            wf = wfields.get(rf["name"]) or next(
                (wfields[a] for a in rf.get("aliases", ()) if a in wfields), None
            )
            if wf is None:
                if "default" not in rf:
                    out.append(f"{fpath}: new field without a default")
            else:
                _check(wf["type"], rf["type"], wt, rt, fpath, out, seen)
    elif wk == "enum":
        missing = [s for s in w["symbols"] if s not in r["symbols"]]
        if missing and "default" not in r:
            out.append(f"{path}: enum symbols {missing} were removed")
    elif wk == "array":
        _check(w["items"], r["items"], wt, rt, f"{path}[]", out, seen)
    elif wk == "map":
        _check(w["values"], r["values"], wt, rt, f"{path}{{}}", out, seen)
    elif wk == "fixed":
        if w["size"] != r["size"]:
            out.append(f"{path}: fixed size changed from {w['size']} to {r['size']}")
