// Driven by todos/tests/test_mcp_tasks_2025.py: the official TypeScript SDK 1.x client's experimental tasks
// (the 2025-11-25 wire, as VS Code speaks it) against Switchboard. Prints {"taskId"} once the task exists
// (the test then completes the todo), then one JSON line of what it saw.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const { SWITCHBOARD_MCP_URL: url, SWITCHBOARD_TOKEN: token } = process.env;
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
const client = new Client({ name: "switchboard-ts-tasks", version: "0" }, { capabilities: { tasks: { list: {}, cancel: {} } } });
await client.connect(transport);
const tools = (await client.listTools()).tools;
const seen = {
  protocol: transport.protocolVersion,
  capability: client.getServerCapabilities().tasks,
  execution: tools.find((t) => t.name === "create_for").execution,
  statuses: [],
};

const stream = client.experimental.tasks.callToolStream(
  { name: "create_for", arguments: { queue: "jobs", title: "from the TS client" } },
  undefined,
  { task: { ttl: 60000 } },
);
for await (const message of stream) {
  if (message.type === "taskCreated") {
    seen.created = message.task;
    console.log(JSON.stringify({ taskId: message.task.taskId }));
  } else if (message.type === "taskStatus") {
    seen.statuses.push(message.task.status);
  } else if (message.type === "result") {
    seen.result = message.result;
  } else if (message.type === "error") {
    seen.error = { code: message.error.code, message: message.error.message };
  }
}
seen.got = await client.experimental.tasks.getTask(seen.created.taskId);
seen.listed = (await client.experimental.tasks.listTasks()).tasks.map((t) => t.taskId);

const second = client.experimental.tasks.callToolStream(
  { name: "create_for", arguments: { queue: "jobs", title: "to cancel" } },
  undefined,
  { task: { ttl: 60000 } },
);
for await (const message of second) {
  if (message.type === "taskCreated") {
    seen.cancelled = await client.experimental.tasks.cancelTask(message.task.taskId);
    break;
  }
}
await client.close();
console.log(JSON.stringify(seen));
