"""The fake model's tool calls: which tools it calls, with which arguments, and
how the arguments are cut into deltas, all deterministic so tests can predict
every byte.

Arguments come from the tool's JSON Schema (`example_value`): each property
gets a value of its type (its `const`, `default` or first `enum` member when
it has one), so a client's own schema validation accepts them. The JSON text
is then streamed as OpenAI streams it (`deltas`): a call's first delta
carries its index, id and name with empty arguments, the later ones only the
index and the next piece of the arguments, at least `MIN_PIECES` of them (a
client that assembles by concatenation is exercised, not just one that reads
one blob). Several calls interleave round-robin by index, so a client that
assembles by `index` is tested against one that assumes calls come one
after another.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.engine.backends.base import ToolCallPiece, ToolSpec

MIN_PIECES = 5  # argument pieces per call (fewer only when the JSON is shorter)
_DEPTH_LIMIT = 8  # a recursive schema ($ref loops are not followed) still ends


def example_value(schema: Mapping[str, Any], name: str = "value", depth: int = 0) -> Any:
    """A value that satisfies the common JSON Schema keywords of `schema`."""
    if "const" in schema:
        return schema["const"]
    if "default" in schema:
        return schema["default"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    kind = schema.get("type")
    if isinstance(kind, list):  # ["string", "null"]: the first type that is not null
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        for union in ("anyOf", "oneOf"):
            members = schema.get(union)
            if isinstance(members, list) and members and isinstance(members[0], Mapping):
                return example_value(members[0], name, depth)
        kind = "object" if "properties" in schema else "string"
    if depth >= _DEPTH_LIMIT:
        kind = "null" if kind in ("object", "array") else kind
    if kind == "object":
        properties = schema.get("properties")
        if not isinstance(properties, Mapping):
            return {}
        return {key: example_value(sub if isinstance(sub, Mapping) else {}, key, depth + 1)
                for key, sub in properties.items()}
    if kind == "array":
        items = schema.get("items")
        count = max(1, int(schema.get("minItems", 1)))
        item = example_value(items if isinstance(items, Mapping) else {}, name, depth + 1)
        return [item] * count
    if kind == "integer":
        return int(schema.get("minimum", 1))
    if kind == "number":
        return float(schema.get("minimum", 1.5))
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return f"example {name}"


def arguments_json(tool: ToolSpec) -> str:
    """The call's arguments as OpenAI sends them: JSON text of an object."""
    value = example_value(tool.parameters) if tool.parameters else {}
    if not isinstance(value, dict):
        value = {}
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def split_pieces(text: str, pieces: int = MIN_PIECES) -> list[str]:
    """`text` cut into `pieces` consecutive non-empty pieces, as even as they
    go (fewer when the text is shorter; one empty piece for empty text)."""
    count = max(1, min(pieces, len(text)))
    size, extra = divmod(len(text), count)
    out, at = [], 0
    for i in range(count):
        end = at + size + (1 if i < extra else 0)
        out.append(text[at:end])
        at = end
    return out


def call_id(request_id: str, index: int) -> str:
    """OpenAI's shape (`call_` and 24 characters), stable for a request and index."""
    digest = hashlib.sha256(f"{request_id}/{index}".encode()).hexdigest()
    return f"call_{digest[:24]}"


@dataclass(frozen=True)
class PlannedCall:
    index: int
    id: str
    name: str
    arguments: str


def plan(tools: tuple[ToolSpec, ...], forced: str | None, count: int,
         request_id: str) -> list[PlannedCall]:
    """The calls to make: `count` of the forced tool, else of the offered
    tools in turn (more calls than tools start over at the first)."""
    by_name = {tool.name: tool for tool in tools}
    chosen = [by_name[forced]] if forced is not None else list(tools)
    return [PlannedCall(i, call_id(request_id, i), tool.name, arguments_json(tool))
            for i, tool in ((i, chosen[i % len(chosen)]) for i in range(count))]


def deltas(calls: list[PlannedCall], pieces: int = MIN_PIECES) -> list[ToolCallPiece]:
    """Every call's deltas, interleaved round-robin by index: each call's head
    (id, name, empty arguments), then its argument pieces in turn."""
    per_call = [
        [ToolCallPiece(call.index, call.id, call.name, "")]
        + [ToolCallPiece(call.index, "", "", piece)
           for piece in split_pieces(call.arguments, pieces)]
        for call in calls
    ]
    out: list[ToolCallPiece] = []
    for step in range(max((len(c) for c in per_call), default=0)):
        out.extend(c[step] for c in per_call if step < len(c))
    return out
