"""docs/params.schema.json: generated from the params models, current, and wired into the
editors (the devcontainer's YAML extension, params.yaml's modeline)."""

from __future__ import annotations

import json
import sys
from typing import Any

import yaml

from helpers import REPO

sys.path.insert(0, str(REPO / "tools"))
import params_schema

SCHEMA = json.loads(params_schema.SCHEMA.read_text())


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    """Follow a `$ref` (and an `anyOf` with null, for optional sections) to an object schema."""
    if "$ref" in node:
        return _resolve(SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[1]])
    for option in node.get("anyOf", ()):
        if option.get("type") != "null":
            return _resolve(option)
    return node


def unknown_keys(value: Any, node: dict[str, Any], path: str = "") -> list[str]:
    """The keys of `value` that the schema does not allow (what an editor underlines)."""
    node = _resolve(node)
    if not isinstance(value, dict) or node.get("type") != "object":
        return []
    found = []
    for key, item in value.items():
        where = f"{path}.{key}" if path else key
        if key in node.get("properties", {}):
            found += unknown_keys(item, node["properties"][key], where)
        elif isinstance(node.get("additionalProperties"), dict):
            found += unknown_keys(item, node["additionalProperties"], where)
        else:
            found.append(where)
    return found


def test_the_committed_schema_is_the_generated_one() -> None:
    assert params_schema.SCHEMA.read_text() == params_schema.render(), (
        "docs/params.schema.json is stale: run `make schema`"
    )


def test_the_schema_knows_every_key_of_params_yaml_and_no_typo() -> None:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    assert unknown_keys(params, SCHEMA) == []
    params["train"]["epoch"] = 3
    params["variants"]["cpu"]["precison"] = "bf16"
    assert unknown_keys(params, SCHEMA) == ["train.epoch", "variants.cpu.precison"]
    variant = _resolve(SCHEMA["properties"]["variants"]["additionalProperties"])
    assert variant["properties"]["precision"]["enum"] == ["fp32", "fp16", "bf16"]
    assert variant["required"] == ["device"]


def test_editors_find_the_schema() -> None:
    first = (REPO / "params.yaml").read_text().splitlines()[0]
    assert first == "# yaml-language-server: $schema=docs/params.schema.json"
    import json5  # dev-only: the GPU host, which has the runtime group, collects this file

    devcontainer = json5.loads((REPO / ".devcontainer" / "devcontainer.json").read_text())
    vscode = devcontainer["customizations"]["vscode"]
    assert "redhat.vscode-yaml" in vscode["extensions"]
    assert vscode["settings"]["yaml.schemas"] == {"docs/params.schema.json": ["params.yaml"]}
