"""JSON schemas of function tools as TypeScript, as the model saw them in
training: a line-by-line port of openai-harmony's json_schema_to_typescript,
quirks included (the model was trained on its output, not on a tidier one)."""
from __future__ import annotations

import json


def _get(schema, key):
    return schema.get(key) if isinstance(schema, dict) else None


def _has(schema, key) -> bool:
    """Whether the schema has the key, null or not (serde's get: Some(Null))."""
    return isinstance(schema, dict) and key in schema


def _json(v) -> str:
    """v as openai-harmony writes it (serde_json: compact, numbers by ryu)."""
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, int):
        if -2**63 <= v < 2**64:
            return str(v)
        try:
            return _number(float(v))      # past 64 bits: an f64, as serde reads it
        except OverflowError:             # past an f64 too (openai-harmony refuses it): the digits
            return str(v)
    if isinstance(v, float):
        return _number(v)
    if isinstance(v, dict):
        return "{" + ",".join(f"{json.dumps(str(k), ensure_ascii=False)}:{_json(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_json(x) for x in v) + "]"
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def _number(f: float) -> str:
    """A float as ryu writes it (serde_json's): the shortest digits that read
    back, plain from 1e-5 up to below 1e16, else d.ddde±N with no "+" nor
    padding (Python writes 1e-05 and 1e+16); not finite: null. (The numbers
    schemas hold come out as openai-harmony's; its parser is not correctly
    rounded, so a float of 17 significant digits may differ in the last.)"""
    if f != f or f in (float("inf"), float("-inf")):
        return "null"
    if f == 0:
        return "-0.0" if str(f).startswith("-") else "0.0"
    sign, r = ("-", repr(-f)) if f < 0 else ("", repr(f))
    mantissa, _, exp = r.partition("e")
    whole, _, frac = mantissa.partition(".")
    digits, point = whole + frac, len(whole) + int(exp or 0)
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    digits = stripped.rstrip("0") or "0"
    n = len(digits)
    if n <= point <= 16:
        out = digits + "0" * (point - n) + ".0"
    elif 0 < point <= 16:
        out = digits[:point] + "." + digits[point:]
    elif -5 < point <= 0:
        out = "0." + "0" * -point + digits
    else:
        out = digits[0] + ("." + digits[1:] if n > 1 else "") + f"e{point - 1}"
    return sign + out


def _is_enum(schema) -> bool:
    e = _get(schema, "enum")
    return isinstance(e, list) and len(e) > 0


def _default(d, schema, raw_enum_strings: bool = True) -> str:
    if isinstance(d, str) and not _is_enum(schema):
        return f'"{d}"'
    if isinstance(d, str) and raw_enum_strings:
        return d
    return _json(d)


def _nullable(variant, type_str: str) -> str:
    if _get(variant, "nullable") is True and "null" not in type_str:
        return type_str + " | null"
    return type_str


def schema_to_typescript(schema, indent: str) -> str:
    one_of = _get(schema, "oneOf")
    if isinstance(one_of, list):
        out = ""
        for variant in one_of:
            out += f"\n{indent} | " + _nullable(variant, schema_to_typescript(variant, indent + "   "))
            trailing = []
            if isinstance(_get(variant, "description"), str):
                trailing.append(variant["description"])
            if _has(variant, "default"):
                trailing.append("default: " + _default(variant["default"], variant, raw_enum_strings=False))
            if trailing:
                out += " // " + " ".join(trailing)
        return out
    ty = _get(schema, "type")
    if isinstance(ty, list):
        names = ["number" if t == "integer" else t for t in ty if isinstance(t, str)]
        if names:
            return " | ".join(names)
    if not isinstance(ty, str):
        return "any"
    if ty == "object":
        return _object_to_typescript(schema, indent)
    if ty == "string":
        enum = _get(schema, "enum")
        if isinstance(enum, list):
            names = [f'"{v}"' for v in enum if isinstance(v, str)]
            if names:
                return " | ".join(names)
        return "string"
    if ty in ("number", "integer"):
        return "number"
    if ty == "boolean":
        return "boolean"
    if ty == "array":
        items = _get(schema, "items")
        return schema_to_typescript(items, indent) + "[]" if _has(schema, "items") else "Array<any>"
    return "any"


def _object_to_typescript(schema: dict, indent: str) -> str:
    out = ""
    if isinstance(schema.get("description"), str):
        out += f"{indent}// {schema['description']}\n"
    out += "{\n"
    props = schema.get("properties")
    if isinstance(props, dict):
        req = schema.get("required")
        required = {r for r in req if isinstance(r, str)} if isinstance(req, list) else set()
        for key, val in props.items():
            opt = "" if key in required else "?"
            if isinstance(_get(val, "title"), str):
                out += f"{indent}// {val['title']}\n{indent}//\n"
            one_of = _get(val, "oneOf")
            if not _has(val, "oneOf") and isinstance(_get(val, "description"), str):
                out += f"{indent}// {val['description']}\n"
            examples = _get(val, "examples")
            if isinstance(examples, list) and examples:
                out += f"{indent}// Examples:\n"
                out += "".join(f'{indent}// - "{ex}"\n' for ex in examples if isinstance(ex, str))
            if isinstance(one_of, list):
                out += _one_of_property(key, opt, val, one_of, indent)
                continue
            out += f"{indent}{key}{opt}: " + _nullable(val, schema_to_typescript(val, indent + "    ")) + ","
            if not _has(val, "oneOf") and _has(val, "default"):
                out += " // default: " + _default(val["default"], val)
            out += "\n"
    return out + f"{indent}}}"


def _one_of_property(key: str, opt: str, val: dict, variants: list, indent: str) -> str:
    out = ""
    desc = val.get("description") if isinstance(val.get("description"), str) else None
    # The property's description is not repeated when the first variant has it.
    skip = desc is not None and bool(variants) and _get(variants[0], "description") == desc
    above = False
    if not skip and desc is not None:
        out += f"{indent}// {desc}\n"
        above = True
    if "default" in val:
        out += f"{indent}// default: {_default(val['default'], val)}\n"
    out += f"{indent}{key}{opt}:\n"
    for i, variant in enumerate(variants):
        out += f"{indent} | " + _nullable(variant, schema_to_typescript(variant, indent + "   "))
        trailing = []
        vdesc = _get(variant, "description")
        if not (i == 0 and above) and isinstance(vdesc, str) and vdesc != desc:
            trailing.append(vdesc)
        if _has(variant, "default"):
            trailing.append("default: " + _default(variant["default"], variant))
        if trailing:
            out += " // " + " ".join(trailing)
        out += "\n"
    return out + f"{indent},\n"
