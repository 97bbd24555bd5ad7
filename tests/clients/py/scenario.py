#!/usr/bin/env python3
"""A real MCP client (the Python SDK, `mcp==2.3.0`) driving `psych serve`.

Run by `cli/tests/serve_clients.rs` with the interpreter of `target/mcp-venv` (made by
`cargo xtask clients`). Against a gateway whose config has a direct server (`--direct`,
default `up`: a `psych serve-embedded` pinned direct) and a deferred one (`--deferred`,
default `deferred`), it runs:

  1. list the tools (waiting until every upstream is listed);
  2. call a direct tool (`<direct>__echo`);
  3. list -> describe -> call `echo` of the deferred server through the meta tools;
  4. a large call (`<direct>__large`) whose result is elided: prints `{"handle": ...}` on
     stdout as soon as it has it, reads the handle back on the same connection, reads the
     whole result through the preview's `resource_link` (`resources/read`), and hands one
     line of it to `<direct>__echo` by reference (`{"$psych_result": handle, ...}`);
  5. trigger `<direct>__add_tool` and wait (10 s) for `notifications/tools/list_changed`
     (legacy: the session's notification handler; modern: a `subscriptions/listen`
     stream), then find the new tool listed.

With `--read HANDLE --expect-prefix TEXT` it instead opens a NEW connection and calls
`read_tool_output` on HANDLE (with `--grep` if given), checking that a line of the answer
(its line-number gutter removed) starts with TEXT.

The last line on stdout is a JSON summary: `{"ok": true|false, "sdk": "python", ...}`;
on failure it names the step and the error (with the JSON-RPC code and data when the
server answered an error), and the exit status is 1. Usage errors exit 2.

  scenario.py --transport stdio --mode legacy --command PSYCH serve --config F --dir D
  scenario.py --transport http --mode modern --url http://127.0.0.1:PORT/mcp [--token T]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import sys
import time
import traceback
from contextlib import AsyncExitStack
from typing import Any

import anyio
import mcp
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

SDK = f"python mcp=={importlib.metadata.version('mcp')}"
MODERN = "2026-07-28"
HANDLE = re.compile(r'handle "([^"]+)"')
GUTTER = re.compile(r"^\s*\d+\t")
# Upstream servers connect after the gateway answers; their tools arrive via list_changed.
READY_WITHIN = 60.0
CHANGED_WITHIN = 10.0


class Failure(Exception):
    """A step's check failed; the message says what was expected and what came."""


def log(message: str) -> None:
    print(f"scenario.py: {message}", file=sys.stderr, flush=True)


def emit(value: dict[str, Any]) -> None:
    print(json.dumps(value, sort_keys=True), flush=True)


def describe_error(error: BaseException) -> dict[str, Any]:
    """The error as JSON: its type, message, and the JSON-RPC code and data if any."""
    # anyio task groups wrap errors in exception groups; report the first leaf.
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    described: dict[str, Any] = {"type": type(error).__name__, "message": str(error)}
    if isinstance(error, MCPError):
        described["code"] = error.code
        if error.data is not None:
            described["data"] = error.data
    cause = error.__cause__ or error.__context__
    if cause is not None and cause is not error:
        described["cause"] = {"type": type(cause).__name__, "message": str(cause)}
    return described


def text(result: Any) -> str:
    """The result's text blocks, or its structured content's JSON when it has no text."""
    shown = "".join(getattr(block, "text", "") for block in result.content)
    if not shown and result.structured_content is not None:
        return json.dumps(result.structured_content, separators=(",", ":"))
    return shown


class Scenario:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.changed = anyio.Event()
        self.notified = 0
        self.steps: list[dict[str, Any]] = []
        self.summary: dict[str, Any] = {
            "sdk": SDK,
            "transport": args.transport,
            "mode": args.mode,
            "steps": self.steps,
        }

    # Connection.

    async def on_message(self, message: Any) -> None:
        if isinstance(message, Exception):
            log(f"transport error: {message!r}")
            return
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            self.notified += 1
            self.changed.set()

    async def connect(self, stack: AsyncExitStack) -> Client:
        args = self.args
        if args.transport == "stdio":
            target: Any = StdioServerParameters(command=args.command[0], args=args.command[1:])
        else:
            headers = {"Authorization": f"Bearer {args.token}"} if args.token else None
            http = await stack.enter_async_context(create_mcp_http_client(headers=headers))
            target = streamable_http_client(args.url, http_client=http)
        client = Client(
            target,
            mode=MODERN if args.mode == "modern" else "legacy",
            message_handler=self.on_message,
            read_timeout_seconds=30.0,
            client_info=mcp.types.Implementation(name="psych-scenario-py", version="0"),
            # No response cache: every listing in the scenario must reach the gateway.
            cache=None,
        )
        await stack.enter_async_context(client)
        self.summary["protocol_version"] = client.protocol_version
        info = client.server_info
        self.summary["server"] = info.name if info is not None else None
        return client

    async def call(self, client: Client, name: str, arguments: dict[str, Any]) -> Any:
        result = await client.call_tool(name, arguments)
        if result.is_error:
            raise Failure(f"{name} {json.dumps(arguments)}: a tool error: {text(result)}")
        return result

    async def list_all(self, client: Client) -> list[Any]:
        tools: list[Any] = []
        cursor = None
        for _ in range(64):
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                return tools
        raise Failure("tools/list: more than 64 pages")

    def step(self, name: str, **facts: Any) -> None:
        self.steps.append({"step": name, "ok": True, **facts})
        log(f"{name}: ok {json.dumps(facts, sort_keys=True)}")

    # Steps.

    async def run(self) -> None:
        args = self.args
        direct, deferred = args.direct, args.deferred
        async with AsyncExitStack() as stack:
            self.current = "connect"
            client = await self.connect(stack)

            self.current = "list"
            tools = await self.wait_ready(client)
            names = [tool.name for tool in tools]
            for name in [
                f"{direct}__echo",
                f"{direct}__large",
                f"{direct}__add_tool",
                "psych_list_tools",
                "psych_describe_tool",
                "psych_call_tool",
                "read_tool_output",
            ]:
                if name not in names:
                    raise Failure(f"{name} is not listed: {names}")
            own = [n for n in names if n.startswith(f"{deferred}__")]
            if own:
                raise Failure(f"the deferred server {deferred} has tools listed directly: {own}")
            self.step("list", tools=len(names))

            self.current = "direct"
            said = f"hello from {SDK} over {args.transport}"
            echoed = text(await self.call(client, f"{direct}__echo", {"text": said}))
            if echoed != said:
                raise Failure(f"{direct}__echo answered {echoed!r}, not {said!r}")
            self.step("direct", tool=f"{direct}__echo")

            self.current = "deferred"
            listing = text(await self.call(client, "psych_list_tools", {"server": deferred}))
            if '"name":"echo"' not in listing.replace(" ", ""):
                raise Failure(f"psych_list_tools {deferred}: no echo in {listing[:2000]}")
            described = text(
                await self.call(client, "psych_describe_tool", {"server": deferred, "tool": "echo"})
            )
            if "Answers the text" not in described:
                raise Failure(f"psych_describe_tool {deferred} echo: {described[:2000]}")
            said = "hello, deferred"
            echoed = text(
                await self.call(
                    client,
                    "psych_call_tool",
                    {"server": deferred, "tool": "echo", "arguments": {"text": said}},
                )
            )
            if echoed != said:
                raise Failure(f"psych_call_tool {deferred} echo answered {echoed!r}, not {said!r}")
            self.step("deferred", server=deferred)

            self.current = "elided"
            large = await self.call(client, f"{direct}__large", {"bytes": 200_000})
            shown = text(large)
            if len(shown) >= 10_000:
                raise Failure(f"{direct}__large was not elided: {len(shown)} characters shown")
            if not shown.startswith("line 000001: the quick brown fox"):
                raise Failure(f"{direct}__large: the elided text starts {shown[:200]!r}")
            found = HANDLE.search(shown)
            if found is None:
                raise Failure(f"{direct}__large: no handle in {shown[-1000:]!r}")
            handle = found.group(1)
            self.summary["handle"] = handle
            emit({"handle": handle})
            read = text(
                await self.call(client, "read_tool_output", {"handle": handle, "grep": "line 002345:"})
            )
            if "line 002345: the quick brown fox jumps over the lazy dog" not in read:
                raise Failure(f"read_tool_output {handle} on the same connection: {read[:2000]}")
            # The preview links the whole result, which resources/read serves.
            links = [str(b.uri) for b in large.content if getattr(b, "type", None) == "resource_link"]
            if len(links) != 1:
                raise Failure(f"{direct}__large: {len(links)} resource links in {large.content!r:.2000}")
            whole = await client.read_resource(links[0])
            body = "".join(getattr(c, "text", "") for c in whole.contents)
            if len(body) != 200_000 or "line 002345: the quick brown fox" not in body:
                raise Failure(f"resources/read {links[0]}: {len(body)} characters")
            # A line of it handed to another tool by reference.
            passed = text(
                await self.call(
                    client,
                    f"{direct}__echo",
                    {"text": {"$psych_result": handle, "offset": 2344, "limit": 1}},
                )
            )
            self.step(
                "elided",
                handle=handle,
                shown_chars=len(shown),
                resource_chars=len(body),
                passed=passed,
            )

            self.current = "list_changed"
            await self.list_changed(client)

    async def wait_ready(self, client: Client) -> list[Any]:
        """The listing once no upstream is "not listed yet" (each arrives with list_changed)."""
        with anyio.fail_after(READY_WITHIN):
            while True:
                tools = await self.list_all(client)
                listed = json.dumps([tool.model_dump(mode="json") for tool in tools])
                if "not listed yet" not in listed:
                    return tools
                await anyio.sleep(0.2)

    async def list_changed(self, client: Client) -> None:
        direct = self.args.direct
        fresh = f"fresh_py_{self.args.mode}_{self.args.transport}_{os.getpid()}"
        if self.args.mode == "modern":
            async with client.listen(tools_list_changed=True) as subscription:
                honored = subscription.honored
                self.summary["listen_honored"] = honored.model_dump(
                    mode="json", by_alias=True, exclude_none=True
                )
                heard = anyio.Event()

                async def drain() -> None:
                    async for event in subscription:
                        log(f"listen event: {event!r}")
                        heard.set()

                async with anyio.create_task_group() as group:
                    group.start_soon(drain)
                    await self.trigger_and_wait(client, fresh, heard)
                    group.cancel_scope.cancel()
        else:
            self.changed = anyio.Event()
            await self.trigger_and_wait(client, fresh, None)
        self.step("list_changed", added=f"{direct}__{fresh}", notifications=self.notified)

    async def trigger_and_wait(self, client: Client, fresh: str, heard: anyio.Event | None) -> None:
        direct = self.args.direct
        await self.call(client, f"{direct}__add_tool", {"name": fresh})
        started = time.monotonic()
        with anyio.move_on_after(CHANGED_WITHIN) as waited:
            while True:
                event = heard if heard is not None else self.changed
                await event.wait()
                names = [tool.name for tool in await self.list_all(client)]
                if f"{direct}__{fresh}" in names:
                    break
                # An earlier change (not ours): wait for the next one.
                if heard is not None:
                    heard = anyio.Event()
                else:
                    self.changed = anyio.Event()
        if waited.cancelled_caught:
            how = "subscriptions/listen" if heard is not None else "the notification handler"
            raise Failure(
                f"no notifications/tools/list_changed naming {direct}__{fresh} through {how} "
                f"within {CHANGED_WITHIN:.0f} s"
            )
        self.summary["list_changed_after_s"] = round(time.monotonic() - started, 3)

    async def read(self) -> None:
        args = self.args
        async with AsyncExitStack() as stack:
            self.current = "connect"
            client = await self.connect(stack)
            self.current = "read"
            arguments: dict[str, Any] = {"handle": args.read}
            if args.grep:
                arguments["grep"] = args.grep
            shown = text(await self.call(client, "read_tool_output", arguments))
            # Each shown line is `<number>\t<line>`: the reader's gutter comes off.
            lines = [GUTTER.sub("", line) for line in shown.splitlines()]
            if not any(line.startswith(args.expect_prefix) for line in lines):
                raise Failure(
                    f"read_tool_output {json.dumps(arguments)} on a new connection: no line starts "
                    f"with {args.expect_prefix!r} in {shown[:2000]!r}"
                )
            self.summary["handle"] = args.read
            self.step("read", handle=args.read, chars=len(shown))


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transport", choices=["stdio", "http"], required=True)
    parser.add_argument("--mode", choices=["modern", "legacy"], required=True)
    parser.add_argument("--url", help="psych serve --http's URL (with --transport http)")
    parser.add_argument("--token", help="sent as Authorization: Bearer TOKEN over HTTP")
    parser.add_argument("--direct", default="up", help="the direct upstream server's name")
    parser.add_argument("--deferred", default="deferred", help="the deferred server's name")
    parser.add_argument("--read", metavar="HANDLE", help="only read HANDLE on a new connection")
    parser.add_argument("--grep", help="with --read: read_tool_output's grep")
    parser.add_argument("--expect-prefix", help="with --read: a line of the answer starts so")
    parser.add_argument(
        "--command",
        nargs=argparse.REMAINDER,
        help="(last) the command that runs psych serve over stdio, with its arguments",
    )
    args = parser.parse_args(argv)
    if args.transport == "stdio" and not args.command:
        parser.error("--transport stdio needs --command PSYCH serve ...")
    if args.transport == "http" and not args.url:
        parser.error("--transport http needs --url")
    if args.token and args.transport != "http":
        parser.error("--token is sent over HTTP only")
    if args.read and not args.expect_prefix:
        parser.error("--read needs --expect-prefix")
    return args


async def main(argv: list[str]) -> int:
    args = parse(argv)
    scenario = Scenario(args)
    scenario.current = "connect"
    try:
        if args.read:
            await scenario.read()
        else:
            await scenario.run()
    except BaseException as error:  # noqa: BLE001 - every failure is reported, then exit 1
        if isinstance(error, KeyboardInterrupt):
            raise
        failed = scenario.current
        described = describe_error(error)
        scenario.summary.update(ok=False, failed_step=failed, error=described)
        log(f"FAILED at step {failed}: {json.dumps(described)}")
        if os.environ.get("SCENARIO_TRACEBACK"):
            traceback.print_exception(error, file=sys.stderr)
        emit(scenario.summary)
        return 1
    scenario.summary["ok"] = True
    emit(scenario.summary)
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main, sys.argv[1:]))
