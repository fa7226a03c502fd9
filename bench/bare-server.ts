// The bare ceiling for the API: Koa with no middleware and one POST route that runs the transfer's
// single statement through a postgres.js pool. Forked by bench/run.ts; says { type: 'ready', port }.
import { randomBytes } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import Koa from 'koa';
import postgres from 'postgres';
import { TRANSFER_STATEMENT } from './transfer-sql.ts';

const url = process.env.BENCH_DATABASE_URL;
const companyId = process.env.BENCH_COMPANY_ID;
if (!url || !companyId) throw new Error('BENCH_DATABASE_URL and BENCH_COMPANY_ID are required');
const sql = postgres(url, {
  max: Number(process.env.BENCH_POOL_MAX ?? 32),
  // postgres.js reads max_pipeline but its types omit it (as in db/client.ts).
  ...({ max_pipeline: Number(process.env.BENCH_MAX_PIPELINE ?? 100) } as object),
  prepare: true,
  onnotice: () => undefined,
  connection: { application_name: 'bench-bare' },
});

interface Body {
  amount: number;
  currency: string;
  source: string;
  destination: string;
}

const app = new Koa();
app.use(async (ctx) => {
  if (ctx.method !== 'POST' || ctx.path !== '/transfers') {
    ctx.status = 404;
    return;
  }
  const chunks: Buffer[] = [];
  for await (const chunk of ctx.req) chunks.push(chunk as Buffer);
  const body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as Body;
  const key = ctx.get('idempotency-key');
  const [row] = await sql.unsafe(
    TRANSFER_STATEMENT,
    [
      `tr_${randomBytes(16).toString('hex')}`,
      companyId,
      'sandbox',
      key,
      String(body.amount),
      body.currency,
      body.source,
      body.destination,
    ],
    { prepare: true },
  );
  ctx.status = 201;
  ctx.body = row;
});

const server = app.listen(0, '127.0.0.1', () => {
  process.send?.({ type: 'ready', port: (server.address() as AddressInfo).port });
});
server.keepAliveTimeout = 60_000;
process.on('SIGTERM', () => {
  server.close();
  void sql.end({ timeout: 2 }).then(() => process.exit(0));
});
