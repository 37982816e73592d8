"""The JSON schema of params.yaml, generated from the pydantic models that validate it
(`accelbench.core.params.Params`), so that editors complete and check its keys.

    python tools/params_schema.py            # or: make schema

writes `docs/params.schema.json`; VS Code's YAML extension (redhat.vscode-yaml, in the
devcontainer) applies it to params.yaml, and so does any editor that reads params.yaml's
`# yaml-language-server: $schema=` line. The test suite fails when the file is stale.
What a schema cannot say (a combination of keys that does not work, a baseline that names no
variant) `accelbench check` still says.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from accelbench.core.params import VARIANT_NAME, Params

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "docs" / "params.schema.json"


def params_schema() -> dict[str, Any]:
    schema = Params.model_json_schema(mode="validation")
    schema["properties"]["variants"]["propertyNames"] = {"pattern": f"^{VARIANT_NAME.pattern}$"}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "accelbench params.yaml",
        "description": "Every knob of the pipeline (generated from src/accelbench/core/params.py "
        "by tools/params_schema.py; `accelbench check` validates the rest)",
        **{k: v for k, v in schema.items() if k not in ("title", "description")},
    }


def render() -> str:
    return json.dumps(params_schema(), indent=2, sort_keys=True) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=SCHEMA)
    args = parser.parse_args()
    args.out.write_text(render())
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
