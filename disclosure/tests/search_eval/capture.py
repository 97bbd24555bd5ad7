"""List an MCP stdio server's tools and write them as {"tools":[...]} (minified)."""
import asyncio, json, os, sys
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

async def main(out, env_pairs, cmd):
    env = dict(os.environ)
    for pair in env_pairs:
        k, v = pair.split("=", 1)
        env[k] = v
    params = StdioServerParameters(command=cmd[0], args=cmd[1:], env=env)
    async with stdio_client(params, errlog=open(out + ".stderr", "w")) as (r, w):
        async with ClientSession(r, w) as s:
            init = await s.initialize()
            tools = []
            cursor = None
            while True:
                res = await s.list_tools(cursor=cursor) if cursor else await s.list_tools()
                tools.extend(t.model_dump(by_alias=True, exclude_none=True) for t in res.tools)
                cursor = res.nextCursor
                if not cursor:
                    break
    with open(out, "w") as f:
        json.dump({"tools": tools}, f, separators=(",", ":"), ensure_ascii=False)
    print(f"{out}: {len(tools)} tools, server {init.serverInfo.name} {init.serverInfo.version}")

if __name__ == "__main__":
    args = sys.argv[1:]
    out = args.pop(0)
    env_pairs = []
    while args and args[0] == "-e":
        args.pop(0); env_pairs.append(args.pop(0))
    if args and args[0] == "--":
        args.pop(0)
    asyncio.run(asyncio.wait_for(main(out, env_pairs, args), 120))
