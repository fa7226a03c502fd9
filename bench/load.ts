// A closed-loop HTTP load generator, run in its own process (forked by bench/run.ts) so that it
// never shares an event loop with the server it measures. `concurrency` workers each send one
// request, wait for the whole answer, and send the next, for warm-up + duration; only requests that
// start after the warm-up count. Plans and results travel over IPC.
import { Agent, request } from 'node:http';
import { randomBytes } from 'node:crypto';
import { summarize, type LoadPlan, type LoadResult, type SentRequest } from './types.ts';

interface Answer {
  status: number;
  replayed: boolean;
  text: string;
}

function post(agent: Agent, url: URL, headers: Record<string, string>, payload: string): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = request(
      url,
      {
        method: 'POST',
        agent,
        headers: { ...headers, 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload) },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (chunk: Buffer) => chunks.push(chunk));
        res.on('end', () =>
          resolve({
            status: res.statusCode ?? 0,
            replayed: res.headers['idempotent-replayed'] === 'true',
            text: Buffer.concat(chunks).toString('utf8'),
          }),
        );
        res.on('error', reject);
      },
    );
    req.setTimeout(30_000, () => req.destroy(new Error('timeout')));
    req.on('error', reject);
    req.end(payload);
  });
}

export async function runLoad(plan: LoadPlan): Promise<LoadResult> {
  const agent = new Agent({ keepAlive: true, maxSockets: plan.concurrency });
  const url = new URL(plan.path, plan.baseUrl);
  const accounts = plan.accounts ?? [];
  const runId = randomBytes(4).toString('hex');
  const started = performance.now();
  const cpuAtStart = process.cpuUsage();
  let answeredTotal = 0;
  const measureFrom = started + plan.warmupMs;
  const end = measureFrom + plan.durationMs;
  const latencies: number[] = [];
  const byStatus: Record<string, number> = {};
  const sampleErrors: string[] = [];
  const sent: SentRequest[] = [];
  let replayed = 0;
  let networkErrors = 0;
  let ok = 0;
  let counter = 0;
  let replayIndex = 0;

  const next = (): SentRequest => {
    const key = `${plan.keyPrefix}-${runId}-${++counter}`;
    switch (plan.mode) {
      case 'replay': {
        const list = plan.replay ?? [];
        return list[replayIndex++ % list.length]!;
      }
      case 'shapeA':
        return {
          key,
          body: {
            source: { currency: 'USDC', rail: 'stablecoin', amount: '1.00' },
            destination: { currency: 'USD', rail: 'ach', account: plan.achAccountId },
          },
        };
      case 'bare':
      case 'shapeB': {
        const s = Math.floor(Math.random() * accounts.length);
        const d = (s + 1 + Math.floor(Math.random() * (accounts.length - 1))) % accounts.length;
        const amount = 1 + Math.floor(Math.random() * 100);
        return { key, body: { amount, currency: 'USD', source: accounts[s], destination: accounts[d] } };
      }
    }
  };

  if (plan.mode === 'replay' && (plan.replay ?? []).length === 0) throw new Error('replay: no requests to replay');
  const worker = async () => {
    while (performance.now() < end) {
      const item = next();
      const headers: Record<string, string> = { 'idempotency-key': item.key };
      if (plan.apiKey) headers.authorization = `Bearer ${plan.apiKey}`;
      const t0 = performance.now();
      let answer: Answer | undefined;
      try {
        answer = await post(agent, url, headers, JSON.stringify(item.body));
      } catch (error) {
        if (t0 >= measureFrom) networkErrors++;
        if (sampleErrors.length < 5) sampleErrors.push(String(error));
      }
      const t1 = performance.now();
      if (answer) answeredTotal++;
      if (t0 < measureFrom || t1 > end + 30_000 || !answer) continue;
      if (t0 >= end) break;
      latencies.push(t1 - t0);
      byStatus[answer.status] = (byStatus[answer.status] ?? 0) + 1;
      if (answer.replayed) replayed++;
      if (answer.status >= 200 && answer.status < 300) {
        ok++;
        if (plan.recordLimit && sent.length < plan.recordLimit) sent.push(item);
      } else if (sampleErrors.length < 5) sampleErrors.push(`${answer.status} ${answer.text.slice(0, 300)}`);
    }
  };
  await Promise.all(Array.from({ length: plan.concurrency }, () => worker()));
  const measuredMs = Math.max(1, Math.min(performance.now(), end + 30_000) - measureFrom);
  agent.destroy();
  const cpu = process.cpuUsage(cpuAtStart);
  return {
    mode: plan.mode,
    concurrency: plan.concurrency,
    measuredMs,
    completed: latencies.length,
    ok,
    throughput: (ok * 1000) / measuredMs,
    latency: summarize(latencies),
    byStatus,
    replayed,
    networkErrors,
    sampleErrors,
    sent,
    answeredTotal,
    cpuSeconds: (cpu.user + cpu.system) / 1e6,
    ...(plan.keepLatencies ? { latencies } : {}),
  };
}

// As a child process: one plan in, one result out, then exit.
if (process.send) {
  process.once('message', (plan: LoadPlan) => {
    runLoad(plan).then(
      (result) => {
        process.send!({ type: 'result', result }, () => process.exit(0));
      },
      (error: unknown) => {
        process.send!({ type: 'error', error: String(error) }, () => process.exit(1));
      },
    );
  });
  process.send({ type: 'ready' });
}
