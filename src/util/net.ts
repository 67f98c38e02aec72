import { createServer } from 'node:net';

/** A TCP port free now on `host` (all interfaces when omitted), for a rendezvous store another process binds. */
export function freePort(host?: string): Promise<number> {
  return new Promise((res, rej) => {
    const srv = createServer();
    srv.unref();
    srv.once('error', rej);
    srv.listen(0, host, () => {
      const a = srv.address();
      srv.close(() => res(typeof a === 'object' && a ? a.port : 0));
    });
  });
}
