// Driven by todos/tests/test_mcp_ts_client.py: the official TypeScript SDK 1.x client, as an agent on it
// meets a lost lease. It lists the tools first, as clients do, so the SDK validates every structured
// result against the tool's output schema. Prints one JSON line of what it saw.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const { SWITCHBOARD_MCP_URL: url, SWITCHBOARD_TOKEN: token, TODO_ID: id } = process.env;
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
const client = new Client({ name: "switchboard-ts-test", version: "0" });
await client.connect(transport);
const seen = { server: client.getServerVersion(), tools: (await client.listTools()).tools.map((t) => t.name) };

const body = (result) => JSON.parse(result.content[0].text);
const held = body(await client.callTool({ name: "claim", arguments: { id } })).todo;
await client.callTool({ name: "release", arguments: { id, lease_id: held.lease_id } });
const again = await client.callTool({ name: "claim", arguments: { id } });
seen.reclaimed = again.structuredContent.todo.state;
try {
  const stale = await client.callTool({ name: "complete", arguments: { id, lease_id: held.lease_id } });
  seen.stale = { isError: stale.isError, structuredContent: stale.structuredContent ?? null, body: body(stale) };
} catch (error) {
  seen.stale = { thrown: { code: error.code, message: error.message } };
}
try {
  await client.callTool({ name: "delete_everything", arguments: {} });
  seen.unknown = "no error";
} catch (error) {
  seen.unknown = { code: error.code, message: error.message };
}
await client.close();
console.log(JSON.stringify(seen));
