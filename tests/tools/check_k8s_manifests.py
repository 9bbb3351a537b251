"""Check Kubernetes manifests against the API's own models (the official Python client's,
generated from the Kubernetes OpenAPI schema): every field a known one of its type, every
required field present, each value of its declared type. Usage: check_k8s_manifests.py FILE...
Prints one line per object checked; exits 1 naming the first field that does not fit."""

import re
import sys

import kubernetes.client as k8s
import yaml

KINDS = {("node.k8s.io/v1", "RuntimeClass"): "V1RuntimeClass"}
PRIMITIVE = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": object}


def check(value, type_name, at):
    """Check `value` against the model or type `type_name`; `at` names the field."""
    if type_name in PRIMITIVE:
        if not isinstance(value, PRIMITIVE[type_name]) or (type_name == "int" and isinstance(value, bool)):
            raise ValueError(f"{at}: {value!r} is not a {type_name}")
        return
    m = re.fullmatch(r"[lL]ist\[(.+)\]", type_name)
    if m:
        if not isinstance(value, list):
            raise ValueError(f"{at}: not a list")
        for i, v in enumerate(value):
            check(v, m.group(1), f"{at}[{i}]")
        return
    m = re.fullmatch(r"dict\((\w+), (.+)\)|Dict\[(\w+), (.+)\]", type_name)
    if m:
        if not isinstance(value, dict):
            raise ValueError(f"{at}: not a map")
        key_type, value_type = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
        for k, v in value.items():
            check(k, key_type, f"{at} key")
            check(v, value_type, f"{at}.{k}")
        return
    model = getattr(k8s, type_name)
    if not isinstance(value, dict):
        raise ValueError(f"{at}: not an object ({type_name})")
    by_json = {j: p for p, j in model.attribute_map.items()}
    for key, v in value.items():
        if key not in by_json:
            raise ValueError(f"{at}.{key}: {type_name} has no such field")
        check(v, model.openapi_types[by_json[key]], f"{at}.{key}")
    # The model's own constructor refuses a required field left out.
    model(**{by_json[k]: v for k, v in value.items()})


def main(paths):
    for path in paths:
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                kind = (doc.get("apiVersion"), doc.get("kind"))
                if kind not in KINDS:
                    raise SystemExit(f"{path}: no model for {kind}")
                try:
                    check(doc, KINDS[kind], kind[1])
                    handler = doc.get("handler", "")
                    if kind[1] == "RuntimeClass" and not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", handler):
                        raise ValueError(f"RuntimeClass.handler {handler!r} is not a DNS-1123 label")
                except (ValueError, TypeError) as e:
                    print(f"{path}: {e}")
                    return 1
                print(f"{path}: {kind[1]} {doc['metadata']['name']} handler={doc.get('handler')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
