import { SELF } from "cloudflare:test";
import { beforeAll, describe, expect, it } from "vitest";
import { chat, post, putCluster, resetSim } from "./helpers";

// The app runs on Hono's tiny preset (its router is a fraction of the default's size), whose
// router also matches "/x/" for "/x". A route is exact, as it was with the default router: a
// path with a trailing slash is an unknown route, not the route without it.

const cluster = {
  policy: { prefill: "round_robin", decode: "round_robin" },
  nodes: [
    { id: "p0", role: "prefill" as const, models: ["sim-model"] },
    { id: "d0", role: "decode" as const, models: ["sim-model"] },
  ],
};

async function expectUnknownRoute(res: Response) {
  expect(res.status).toBe(404);
  expect(((await res.json()) as any).error.code).toBe("unknown_route");
}

describe("routes are matched exactly", () => {
  beforeAll(async () => {
    await resetSim();
    await putCluster(cluster);
  });

  it("the routes answer at their own paths", async () => {
    expect((await SELF.fetch("http://router/healthz")).status).toBe(200);
    expect((await SELF.fetch("http://router/v1/models")).status).toBe(200);
    expect((await post("/v1/chat/completions", chat())).status).toBe(200);
  });

  it("a trailing slash is an unknown route, at the top level and in the sub-apps", async () => {
    await expectUnknownRoute(await SELF.fetch("http://router/healthz/"));
    await expectUnknownRoute(await SELF.fetch("http://router/v1/models/"));
    await expectUnknownRoute(await post("/v1/chat/completions/", chat()));
    await expectUnknownRoute(await SELF.fetch("http://router/metrics/"));
    await expectUnknownRoute(await SELF.fetch("http://router/admin/nodes/"));
  });
});
