import { setTimeout as delay } from 'node:timers/promises';

/** Waits `ms`, or until `signal` aborts; resolves either way (callers check `signal.aborted`). The timer
 *  API removes its abort listener when the time is up, so a long-lived signal collects none. */
export async function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  await delay(ms, undefined, { signal }).catch((e: Error) => {
    if (e.name !== 'AbortError') throw e;
  });
}
