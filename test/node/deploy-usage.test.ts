// Issue 18 item 8: the client's cached_tokens come from P, and vLLM reports them only when P
// runs with --enable-prompt-tokens-details (and the count is non-zero). A P that never reports
// them is named once in the log and as a warning on the status page, /status.json and
// /admin/status. The simulator's `promptTokensDetails: false` is a P started without the flag.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
// @ts-expect-error plain JS module of the simulator
import { startSimCluster } from "../../sim/cluster.mjs";
import { admin, events, startDeployRig, until, type DeployRig } from "./deploy-rig";

let cluster: any;
let rig: DeployRig;

beforeAll(async () => {
  cluster = await startSimCluster({
    defaults: { timeScale: 0.01 },
    engines: [
      { id: "p-flag", role: "prefill" },
      { id: "p-noflag", role: "prefill", promptTokensDetails: false },
      { id: "d0", role: "decode" },
    ],
  });
  const url = (id: string) => cluster.engines.get(id).url;
  rig = await startDeployRig();
  await rig.putDocument({
    protocol: "vllm",
    policy: { prefill: "round_robin", decode: "round_robin" },
    // polls every second: the warning waits for P's /metrics to show prefix-cache hits
    signals: { intervalMs: 1000, staleMs: 3000 },
    nodes: [
      { id: "p-flag", url: url("p-flag"), role: "prefill" },
      { id: "p-noflag", url: url("p-noflag"), role: "prefill" },
      { id: "d0", url: url("d0"), role: "decode" },
    ],
  });
}, 60_000);

afterAll(async () => {
  await rig?.stop();
  await cluster?.close();
});

const chat = (i: number) => ({
  model: "sim-model",
  // a shared opening (a system prompt) followed by a turn of its own: P's prefix cache hits the opening
  messages: [
    { role: "system", content: "You are a careful assistant. ".repeat(200) },
    { role: "user", content: `question ${i}` },
  ],
  max_tokens: 2,
});
const json = async (path: string) => (await rig.fetch(path, { headers: admin })).json() as Promise<any>;
const WARNING =
  "prefill node p-noflag reported no prompt_tokens_details in 20 answers although its /metrics shows prefix-cache hits: run it with --enable-prompt-tokens-details, or clients see cached_tokens 0";
let asked = 0;
async function ask(): Promise<void> {
  const res = await rig.fetch("/v1/chat/completions", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(chat(asked++)) });
  expect(res.status).toBe(200);
  await res.arrayBuffer();
}

describe("8. a P that never reports prompt_tokens_details is named, once in the log and on the status surfaces", () => {
  it("after 20 answers without details (and none with) from a P whose /metrics shows prefix-cache hits: a warning for that P only, one log line however many more follow", async () => {
    // round robin: 50 requests give each P 25 answers
    for (let i = 0; i < 50; i++) await ask();
    // the evidence comes with a poll (its hits counter rose), then a few more answers without details
    const status = await until(
      "the warning in /admin/status",
      async () => {
        await ask();
        await ask();
        return json("/admin/status");
      },
      (s) => s.warnings?.length > 0,
      30_000,
    );
    expect(status.warnings).toEqual([WARNING]);
    expect(status.nodes.find((n: any) => n.id === "p-noflag").usageDetails).toBe("missing");
    expect(status.nodes.find((n: any) => n.id === "p-flag").usageDetails).toBe("reported");

    const data = await json("/status.json");
    expect(data.warnings).toEqual([WARNING]);
    const page = await (await rig.fetch("/status", { headers: admin })).text();
    // the page renders data.warnings into its warnings list
    expect(page).toContain('id="warnings"');
    expect(page).toContain("data.warnings");

    const logged = await until(
      "the log line",
      () => events(rig, "prefill_usage_details_missing"),
      (e) => e.length > 0,
    );
    expect(logged).toHaveLength(1);
    expect(logged[0]).toMatchObject({ node: "p-noflag", message: WARNING });
  });
});
