// Issue 18 item 5: the Responses API's edges against a real cluster. P's leg gets store:false
// (vLLM keeps every stored response in a dict it never evicts, and P's one-token answer is never
// asked for again); background:true is refused with a 400 (its generation would run on one node,
// outside the router's leases and load); SGLang P/D refuses /v1/responses (its handler passes no
// bootstrap fields: test/worker/api-responses.test.ts).
import { beforeEach, describe, expect, it } from "vitest";
import { control, expectNoLoad, post, putCluster, received, resetClusterState, resetSim } from "./helpers";
import { seededRandom } from "../support/seeded";

const random = seededRandom(14);

const RUN = crypto.randomUUID().slice(0, 8);
const rr = { prefill: "round_robin", decode: "round_robin" };
const body = (extra: Record<string, unknown> = {}) => ({
  model: "sim-model",
  instructions: "Be brief.",
  input: `store test ${RUN} ${random()}`,
  max_output_tokens: 4,
  ...extra,
});

describe("5. Responses API: P's leg is never stored", () => {
  beforeEach(async () => {
    await resetSim();
    await resetClusterState();
  });

  it.each(["vllm", "vllm-mooncake"])("%s: P gets store:false whatever the client sent; D gets the client's own store", async (protocol) => {
    // the simulator serves Mooncake's bootstrap /query on the engine's own port
    const { bootstrapPort } = await control("/engines/pslow/options");
    await putCluster({ protocol, policy: rr, nodes: [{ id: "pslow", role: "prefill", bootstrapPort } as any, { id: "d0", role: "decode" }] });
    for (const store of [undefined, true, false]) {
      const res = await post("/v1/responses", body(store === undefined ? {} : { store }));
      expect(res.status).toBe(200);
      expect(((await res.json()) as any).object).toBe("response");
    }
    const ps = (await received("pslow")).filter((r) => r.path === "/v1/responses").map((r) => JSON.parse(r.body));
    const ds = (await received("d0")).filter((r) => r.path === "/v1/responses").map((r) => JSON.parse(r.body));
    expect(ps.map((p) => p.store)).toEqual([false, false, false]);
    expect(ds.map((d) => d.store)).toEqual([undefined, true, false]);
    await expectNoLoad();
  });
});

describe("5. Responses API: background:true is refused, nothing sent", () => {
  beforeEach(resetSim);

  it("400 naming the parameter, no node asked, no lease left", async () => {
    await putCluster({
      protocol: "vllm",
      policy: rr,
      nodes: [
        { id: "p0", role: "prefill" },
        { id: "d0", role: "decode" },
      ],
    });
    const res = await post("/v1/responses", body({ background: true }));
    expect(res.status).toBe(400);
    const { error } = (await res.json()) as any;
    expect(error.param).toBe("background");
    expect(error.code).toBe("unsupported_parameter");
    expect(await received("p0")).toHaveLength(0);
    expect(await received("d0")).toHaveLength(0);
    // background:false is an ordinary request
    expect((await post("/v1/responses", body({ background: false }))).status).toBe(200);
    await expectNoLoad();
  });
});
