// `rankscope mcp` driven by the official MCP client SDK
// (@modelcontextprotocol/sdk, tests/mcp/package.json): it connects over
// stdio, lists the tools, calls each against a live collector holding a
// straggler and a hang, and checks the culprit ranks it gets back.
//
//   node client.mjs RANKSCOPE_CLI '["--collector", "tcp://...", ...]' '{"job": "...", "straggler": 3, "hang": 1, "nodes": [...]}'
//
// Exits 0 when every check holds; otherwise prints each failed check (with
// what the server said) and exits 1.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [cli, cliArgs, expected] = process.argv.slice(2);
if (!cli || !cliArgs || !expected) {
  console.error("usage: node client.mjs RANKSCOPE_CLI CLI_ARGS_JSON EXPECTED_JSON");
  process.exit(2);
}
const want = JSON.parse(expected);
const failures = [];
function check(ok, what, context) {
  if (ok) {
    console.log(`ok: ${what}`);
  } else {
    failures.push(what);
    console.log(`FAILED: ${what}${context === undefined ? "" : "\n" + JSON.stringify(context, null, 2)}`);
  }
}
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
const text = (result) => (result.content || []).map((c) => c.text || "").join("\n");

const transport = new StdioClientTransport({ command: cli, args: [...JSON.parse(cliArgs), "mcp"], stderr: "inherit" });
const client = new Client({ name: "rankscope-e2e", version: "1.0.0" });
await client.connect(transport);

check(client.getServerVersion()?.name === "rankscope", "the server says it is rankscope", client.getServerVersion());
check(client.getServerCapabilities()?.tools !== undefined, "the server offers tools", client.getServerCapabilities());
check((client.getInstructions() || "").includes("list_findings"), "its instructions say where to start");

const { tools } = await client.listTools();
const names = tools.map((t) => t.name).sort();
for (const name of ["explain_finding", "job_report", "list_findings", "node_status", "rank_timeline"])
  check(names.includes(name), `tools/list has ${name}`, names);
for (const tool of tools) check(tool.annotations?.readOnlyHint === true, `${tool.name} is read-only`, tool.annotations);

const call = (name, args) => client.callTool({ name, arguments: args });

// The findings of the job: the straggler and the hang, each naming its rank.
const listed = await call("list_findings", { open_only: false, job: want.job });
check(!listed.isError, "list_findings answers", text(listed));
const findings = listed.structuredContent?.findings || [];
const straggler = findings.find((f) => f.kind === "straggler");
const hang = findings.find((f) => f.kind === "hang" && f.state === "open");
check(straggler !== undefined, "list_findings has the straggler", text(listed));
check(hang !== undefined, "list_findings has the open hang", text(listed));
if (straggler) check(same(straggler.ranks, [want.straggler]), `the straggler is rank ${want.straggler}`, straggler);
if (hang) check(same(hang.ranks, [want.hang]), `the hang names rank ${want.hang}`, hang);
const onlyHangs = await call("list_findings", { kind: "hang" });
check(
  (onlyHangs.structuredContent?.findings || []).every((f) => f.kind === "hang" && f.state === "open"),
  "list_findings narrows to open hangs",
  text(onlyHangs),
);

// Each explained: culprit, cause, cost, next steps.
if (straggler) {
  const explained = await call("explain_finding", { id: straggler.id });
  const data = explained.structuredContent || {};
  check(!explained.isError, "explain_finding answers for the straggler", text(explained));
  check(same(data.culprit?.ranks, [want.straggler]), "its culprit is the slowed rank", data.culprit);
  check(/quota|waiting for a CPU/.test(data.cause || ""), "its cause names the CPU quota or the wait for a CPU", data.cause);
  check(data.cost?.wait_share > 0 && data.cost?.gpu_hours_lost > 0, "its cost is a share of the job and GPU-hours", data.cost);
  check((data.next_steps || []).length > 0 && text(explained).includes("What to do next"), "it says what to do next", text(explained));
}
if (hang) {
  const explained = await call("explain_finding", { id: hang.id });
  const data = explained.structuredContent || {};
  check(!explained.isError, "explain_finding answers for the hang", text(explained));
  check(same(data.culprit?.ranks, [want.hang]), "its culprit is the stopped rank", data.culprit);
  check(same(data.culprit?.nodes, [want.nodes[Math.floor(want.hang / 2)]]), "on its node", data.culprit);
  check((data.cause || "").includes("stopped"), "its cause says the process is stopped", data.cause);
  check((data.next_steps || []).some((s) => s.includes("rank_timeline")), "it points to the rank's timeline", data.next_steps);

  // The stopped rank's timeline around the hang: calls before, none after.
  const timeline = await call("rank_timeline", { comm: hang.comm, rank: want.hang, around: hang.opened_at, window_s: 30 });
  const t = timeline.structuredContent || {};
  check(!timeline.isError, "rank_timeline answers", text(timeline));
  check(t.rank === want.hang && t.node === want.nodes[Math.floor(want.hang / 2)], "for that rank, on its node", t);
  check((t.records || []).length > 0 && t.last_before !== null, "with its calls before the hang", t.last_before);
  check(t.first_after === null, "and none after it: the rank issued nothing since", t.first_after);
  const last = await call("rank_timeline", { comm: hang.comm.slice(0, 8), rank: want.hang, limit: 5 });
  check(!last.isError && (last.structuredContent?.records || []).length === 5, "a hash prefix and a limit work", text(last));
}

// The job's report: GPU-hours, whom it waited on, its findings.
const report = await call("job_report", { job: want.job });
const r = report.structuredContent || {};
check(!report.isError, "job_report answers", text(report));
check(r.job === want.job && r.gpu_hours > 0, "it has the job's GPU-hours", r);
const reported = (r.findings || []).map((f) => f.id);
check((!straggler || reported.includes(straggler.id)) && (!hang || reported.includes(hang.id)), "and its findings", reported);

// The nodes.
const status = await call("node_status", {});
const nodes = (status.structuredContent?.nodes || []).filter((n) => want.nodes.includes(n.node));
check(!status.isError && nodes.length === want.nodes.length, "node_status lists the job's nodes", text(status));
check(nodes.every((n) => n.connected && n.traced_processes > 0), "each connected, tracing processes", nodes);

// Bad calls are tool errors the assistant can read, not protocol failures.
const unknown = await call("explain_finding", { id: 999999999 });
check(unknown.isError === true && text(unknown).includes("no finding"), "an unknown finding is a clear tool error", text(unknown));
const missing = await call("rank_timeline", { rank: 0 });
check(missing.isError === true && text(missing).includes("'comm'"), "a missing argument is named", text(missing));
const noNode = await call("node_status", { node: "no-such-node" });
check(noNode.isError === true && text(noNode).includes("known:"), "an unknown node lists the known ones", text(noNode));
let refused = false;
try {
  await call("no_such_tool", {});
} catch (e) {
  refused = true;
}
check(refused, "an unknown tool is refused");

await client.close();
if (failures.length > 0) {
  console.log(`${failures.length} check(s) failed`);
  process.exit(1);
}
console.log("every check held");
