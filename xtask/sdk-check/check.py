"""Validates rendered request bodies against the official SDKs' request types.

Reads every insta snapshot under the given folders, takes each JSON request body in it (a
whole snapshot, or the `anthropic: {…}` / `openai: {…}` halves of a render snapshot), and
validates it with pydantic's TypeAdapter over the typed dictionaries the `anthropic` and
`openai` Python packages define for `messages.create`, `chat.completions.create` and
`responses.create` (a `responses: {…}` half, or a whole body with `input`). Their
list fields validate lazily (ValidatorIterator), so every value is drained. Bodies that are
not JSON (error reports, snapshots with base64 cut for review) are skipped and counted.

Run by `cargo xtask sdk-check`; not part of `ci`.
"""

import json
import pathlib
import sys

from pydantic import TypeAdapter, ValidationError
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming
from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming
from openai.types.responses.response_create_params import ResponseCreateParamsNonStreaming

ANTHROPIC = TypeAdapter(MessageCreateParamsNonStreaming)
OPENAI = TypeAdapter(CompletionCreateParamsNonStreaming)
RESPONSES = TypeAdapter(ResponseCreateParamsNonStreaming)


def drain(value):
    """Forces every lazy validator in a validated value."""
    if isinstance(value, (str, bytes, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {key: drain(item) for key, item in value.items()}
    return [drain(item) for item in value]


def bodies(text):
    """The (label, JSON text) request bodies of one snapshot's content."""
    content = text.split("\n---\n", 1)[1] if text.startswith("---") else text
    if content.lstrip().startswith("{"):
        yield "", content
        return
    if content.lstrip().startswith('"messages": ['):
        # A snapshot of a body from its messages on (the rest shown elsewhere): made whole
        # again with the required fields in front.
        yield "fragment", '{"model": "m", "max_tokens": 1024, ' + content
        return
    label, chunk = None, []
    for line in content.splitlines():
        for name in ("anthropic: ", "openai: ", "responses: "):
            if line.startswith(name):
                if label is not None:
                    yield label, "\n".join(chunk)
                label, chunk = name[:-2], [line[len(name):]]
                break
        else:
            chunk.append(line)
    if label is not None:
        yield label, "\n".join(chunk)


def main(folders):
    checked, skipped, failures = 0, 0, []
    for folder in folders:
        for path in sorted(pathlib.Path(folder).glob("*.snap")):
            for label, body in bodies(path.read_text()):
                try:
                    value = json.loads(body)
                except ValueError:
                    skipped += 1
                    continue
                if isinstance(value, dict) and (label == "responses" or "input" in value):
                    try:
                        drain(RESPONSES.validate_python(value))
                        checked += 1
                    except ValidationError as err:
                        failures.append(f"{path.name} (responses): {err}")
                    continue
                if not isinstance(value, dict) or "messages" not in value:
                    skipped += 1
                    continue
                if label == "fragment":
                    anthropic = "anthropic" in path.name
                    if not anthropic:
                        del value["max_tokens"]
                else:
                    anthropic = label == "anthropic" or (label == "" and "max_tokens" in value)
                adapter = ANTHROPIC if anthropic else OPENAI
                try:
                    drain(adapter.validate_python(value))
                    checked += 1
                except ValidationError as err:
                    failures.append(f"{path.name} ({'anthropic' if anthropic else 'openai'}): {err}")
    for failure in failures:
        print(failure)
    print(f"sdk-check: {checked} bodies valid, {len(failures)} invalid, {skipped} skipped")
    return 1 if failures or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
