// Starts a Worker in workerd through Miniflare with scripts/workerd-router.mjs — the router, the
// pass-through baseline Worker, or the Durable Object capacity driver — in its own process
// group, so its CPU time and memory can be read from /proc (bench/lib/proc.mjs). The launcher is
// the one the router's own start uses (scripts/router-process.mjs).
export { startWorkerd } from '../../scripts/router-process.mjs';
