// workerd's allocator, read from outside. workerd links Google's tcmalloc statically (its `malloc`
// and `free` are tcmalloc's; glibc's MALLOC_ARENA_MAX and GLIBC_TUNABLES do nothing to it) and
// never starts tcmalloc's background release thread, so memory the runtime frees stays in
// tcmalloc's caches and page heap and counts in RSS until something asks for it back.
//
// `allocatorFigures(pid, { release })` attaches gdb to the process, reads tcmalloc's numeric
// properties (MallocExtension_Internal_GetNumericProperty), optionally calls
// MallocExtension_Internal_ReleaseMemoryToSystem (what a background thread would do) and reads them
// again. The process is stopped while gdb loads the 120 MB binary's symbols (several seconds):
// diagnostics only (`npm run bench -- soak --allocator`). Undefined when gdb is missing or fails.
import { execFile } from 'node:child_process';

/** tcmalloc property -> the report's name (MB) */
const PROPERTIES = /** @type {const} */ ({
  'generic.current_allocated_bytes': 'inUseMb',
  'generic.heap_size': 'heapMb',
  'tcmalloc.pageheap_free_bytes': 'pageHeapFreeMb',
  'tcmalloc.central_cache_free': 'centralCacheFreeMb',
  'tcmalloc.transfer_cache_free': 'transferCacheFreeMb',
  'tcmalloc.thread_cache_free': 'threadCacheFreeMb',
  'tcmalloc.pageheap_unmapped_bytes': 'releasedMb',
});

/** @typedef {Record<typeof PROPERTIES[keyof typeof PROPERTIES], number>} AllocatorFigures */

/** gdb commands printing every property as `name value` @param {string} tag */
function readCommands(tag) {
  return Object.keys(PROPERTIES).flatMap((p) => [
    '-ex',
    `call (char)MallocExtension_Internal_GetNumericProperty("${p}", ${p.length}, $v)`,
    '-ex',
    `printf "${tag} ${p} %lu\\n", *$v`,
  ]);
}

/**
 * @param {number} pid workerd's pid
 * @param {{ release?: boolean }} [o] release: hand tcmalloc's free pages back to the OS and read again
 * @returns {Promise<{ before: AllocatorFigures, afterRelease?: AllocatorFigures } | undefined>}
 */
export function allocatorFigures(pid, o = {}) {
  const args = ['-p', String(pid), '-batch', '-nx', '-ex', 'set $v = (unsigned long*)malloc(8)', ...readCommands('before')];
  if (o.release) args.push('-ex', 'call (void)MallocExtension_Internal_ReleaseMemoryToSystem(1099511627776)', ...readCommands('after'));
  return new Promise((resolve) => {
    execFile('gdb', args, { timeout: 120_000, maxBuffer: 16 * 1024 * 1024 }, (error, stdout) => {
      /** @type {Record<string, Record<string, number>>} */
      const out = {};
      for (const m of String(stdout ?? '').matchAll(/^(before|after) ([\w.]+) (\d+)$/gm)) {
        const name = PROPERTIES[/** @type {keyof typeof PROPERTIES} */ (m[2])];
        (out[m[1]] ??= {})[name] = Math.round(Number(m[3]) / 104857.6) / 10;
      }
      if (error || !out.before) return resolve(undefined);
      resolve({ before: /** @type {AllocatorFigures} */ (out.before), ...(out.after ? { afterRelease: /** @type {AllocatorFigures} */ (out.after) } : {}) });
    });
  });
}
