"""A stand-in for psych serve that already speaks 2026-07-28: the Python SDK's own
dual-era `MCPServer`, with the tool names the scenario scripts expect (`up__echo`,
`up__large` answering an elided-looking text with handle `fake-run:4`, `up__add_tool`,
the meta tools, `read_tool_output`). It lets the scripts' modern-mode paths
(`subscriptions/listen`, per-request `_meta`) be checked by hand until the gateway
serves that revision; no test runs it, and it can go once the modern tests are enabled.

  PY=target/mcp-venv/bin/python
  $PY tests/clients/py/scenario.py --transport stdio --mode modern \
      --command $PY tests/clients/fake/stand_in.py
  $PY tests/clients/fake/stand_in.py 38111 &   # HTTP on http://127.0.0.1:38111/mcp
  node tests/clients/ts/scenario.mjs --transport http --mode modern --url http://127.0.0.1:38111/mcp
  ... --read fake-run:4 --grep 'line 002345:' --expect-prefix 'line 002345: the quick'
"""
import sys
from typing import Any
from mcp.server.mcpserver import MCPServer, Context

server = MCPServer("fake-psych")
LINES = [f"line {n:06}: the quick brown fox jumps over the lazy dog" for n in range(1, 3510)]

@server.tool(name="up__echo", description="Answers the text.")
def echo(text: str) -> str:
    return text

@server.tool(name="up__large", description="A large result.")
def large(bytes: int) -> str:
    return "\n".join(LINES[:40]) + '\n[elided: read the rest with read_tool_output, handle "fake-run:4"]'

@server.tool(name="up__add_tool", description="Adds a tool and sends list_changed.")
async def add_tool(name: str, ctx: Context) -> str:
    server.add_tool(lambda: "added", name=f"up__{name}", description="Added at runtime.")
    try:
        await ctx.notify_tools_changed()
    except Exception as e:
        print(f"bus: {e!r}", file=sys.stderr)
    try:
        await ctx.session.send_tool_list_changed()
    except Exception as e:
        print(f"legacy notify: {e!r}", file=sys.stderr)
    return f"add_tool {name}"

@server.tool(name="psych_list_tools", description="List a deferred server's tools.")
def list_tools(server: str, page: int = 1) -> str:
    return '{"tools":[{"name":"echo","description":"Answers the text."}]}'

@server.tool(name="psych_describe_tool", description="Describe a deferred tool.")
def describe(server: str, tool: str) -> str:
    return '{"name":"echo","description":"Answers the text.","inputSchema":{}}'

@server.tool(name="psych_call_tool", description="Call a deferred tool.")
def call(server: str, tool: str, arguments: dict[str, Any] | None = None) -> str:
    return (arguments or {}).get("text", "")

@server.tool(name="read_tool_output", description="Read a handle.")
def read(handle: str, grep: str | None = None) -> str:
    if handle != "fake-run:4":
        raise ValueError(f"invalid_deferred_handle {handle}")
    return f'[read_tool_output {handle}]\ngrep "{grep}": 1 matching line\n  2345\t{LINES[2344]}'

if __name__ == "__main__":
    if len(sys.argv) > 1:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
    else:
        server.run()
