import type { LeaseState } from "../forward/lifecycle";
import type { Role } from "../routing/types";
import type { ClusterView, FinishReport, LegReport, RouteRequest, RouteResponse } from "../state/types";

/** A cell a request may be routed in: its object, and the view of the document it holds. */
export interface CellState {
  key: string;
  state: LeaseState;
  view: ClusterView;
}

/**
 * A request's cells as one LeaseState (docs/scaling.md, "One object per cell within a pool"). It
 * asks its cells in order, each told to spill (answer decode_busy rather than wait) — one more
 * round trip only when a cell is busy — and, when every cell is busy, waits at the edge in its
 * first cell, where its conversation's prefix is. A pinned request (a stored response's turn)
 * is spilled by every cell but the one that remembers its nodes. Every later call (renew, failover, finish) goes
 * to the cell that routed it: the lease lives there alone.
 */
export class CellStates implements LeaseState {
  #cells: CellState[];
  #at = 0;
  /** finish was sent (the client left): no further cell is asked */
  #finished = false;

  constructor(cells: CellState[]) {
    this.#cells = cells;
  }

  /** The cells of a newer document (the request is routed again under it: nothing was taken yet). */
  use(cells: CellState[]): void {
    this.#cells = cells;
    this.#at = 0;
  }

  /** The key of the cell the request is in (or being routed in). */
  get key(): string {
    return this.#cells[this.#at]!.key;
  }

  async route(req: RouteRequest): Promise<RouteResponse> {
    const last = this.#cells.length - 1;
    for (let i = 0; i <= last; i++) {
      const routed = await this.#routeIn(i, req, true);
      if (routed.ok || routed.error.kind !== "decode_busy") return routed;
      if (this.#finished) return { ok: false, error: { kind: "client_gone" } };
    }
    return this.#routeIn(0, req, false);
  }

  /** One cell's answer; the cell gets its own view when it holds another. */
  async #routeIn(i: number, req: RouteRequest, spill: boolean): Promise<RouteResponse> {
    this.#at = i;
    const { state, view } = this.#cells[i]!;
    const { cluster: _view, spill: _spill, ...rest } = req;
    const asked: RouteRequest = { ...rest, version: view.version, ...(spill ? { spill } : {}) };
    const routed = await state.route(asked);
    if (!routed.ok && routed.error.kind === "stale_view") return state.route({ ...asked, cluster: view });
    return routed;
  }

  renew(leaseId: string): Promise<unknown> {
    return this.#here().renew(leaseId);
  }

  prefillDone(leaseId: string, report: LegReport): Promise<unknown> {
    return this.#here().prefillDone(leaseId, report);
  }

  failover(leaseId: string, role: Role, report: LegReport, wantNext: boolean): Promise<{ next: string | null; prefill?: string }> {
    return this.#here().failover(leaseId, role, report, wantNext);
  }

  finish(leaseId: string, report: FinishReport): Promise<unknown> {
    this.#finished = true;
    return this.#here().finish(leaseId, report);
  }

  syncView(view: ClusterView): Promise<unknown> {
    return this.#here().syncView(view);
  }

  #here(): LeaseState {
    return this.#cells[this.#at]!.state;
  }
}
