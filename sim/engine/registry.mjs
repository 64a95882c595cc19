// What the engines of one cluster share (sim/engine/types.mjs Registry): who runs, the SGLang
// bootstrap rooms and Mooncake transfers a decode leg waits for, the KV handles P holds, and the
// cluster's simulated clock and network.
import { SimClock } from '../model/clock.mjs';
import { Fabric } from '../model/fabric.mjs';
import { RouterHolds } from '../model/router-holds.mjs';
import { publish, waitFor } from '../wire.mjs';

/**
 * @typedef {import('./types.mjs').Registry} Registry
 * @typedef {import('./types.mjs').RoomEntry} RoomEntry
 * @typedef {import('./types.mjs').TransferEntry} TransferEntry
 */

/** entries a registry map keeps, oldest dropped first */
export const MAX_REMEMBERED = 10000;

/** @returns {Registry} */
export function createRegistry() {
  return {
    engines: new Map(),
    rooms: new Map(),
    roomWaiters: new Map(),
    prefills: new Map(),
    claimedRooms: new Map(),
    handles: new Map(),
    transfers: new Map(),
    transferWaiters: new Map(),
    clocks: new Map(),
  };
}

/**
 * The cluster's clock and network for a time scale, and what stops the clock while the router has a
 * request in hand (sim/model/router-holds.mjs; only the benchmark's clients start such holds).
 * @param {Registry} registry @param {number} timeScale
 */
export function clusterTime(registry, timeScale) {
  let entry = registry.clocks.get(timeScale);
  if (!entry) {
    const clock = new SimClock(timeScale);
    entry = { clock, fabric: new Fabric(clock), holds: new RouterHolds(clock) };
    registry.clocks.set(timeScale, entry);
  }
  return entry;
}

/** @template K, V @param {Map<K, V>} map @param {K} key @param {V} value */
export function remember(map, key, value) {
  map.set(key, value);
  if (map.size > MAX_REMEMBERED) map.delete(/** @type {K} */ (map.keys().next().value));
}

/** @param {Registry} registry @param {string} room @param {RoomEntry} entry */
export function publishRoom(registry, room, entry) {
  publish(registry.rooms, registry.roomWaiters, room, entry, MAX_REMEMBERED);
}

/** @param {Registry} registry @param {string} key @param {TransferEntry} entry */
export function publishTransfer(registry, key, entry) {
  publish(registry.transfers, registry.transferWaiters, key, entry, MAX_REMEMBERED);
}

/**
 * Wait for a Mooncake prefill (D's worker polls P for the transfer_id), the timeout or the client leaving.
 * @param {Registry} registry @param {string} key @param {number} timeoutMs @param {{ closed: boolean }} ctx
 * @returns {Promise<TransferEntry | undefined>}
 */
export function waitTransfer(registry, key, timeoutMs, ctx) {
  return waitFor(registry.transfers, registry.transferWaiters, key, timeoutMs, ctx);
}

/**
 * Wait until the prefill of a room is published, the timeout passes or the client leaves.
 * @param {Registry} registry @param {string} room @param {number} timeoutMs @param {{ closed: boolean }} ctx
 * @returns {Promise<RoomEntry | undefined>}
 */
export function waitRoom(registry, room, timeoutMs, ctx) {
  return waitFor(registry.rooms, registry.roomWaiters, room, timeoutMs, ctx);
}
