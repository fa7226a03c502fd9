// Sends one webhook attempt. SSRF-safe at connection time: the request-filtering agents check the
// address each connection actually goes to, so a DNS answer that changed since the URL was
// registered (url-policy.ts, the first gate) is still caught.
import assert from 'node:assert/strict';
import { lookup as dnsLookup } from 'node:dns';
import type { LookupAddress } from 'node:dns';
import http from 'node:http';
import https from 'node:https';
import { isIP } from 'node:net';
import type { LookupFunction } from 'node:net';
import { performance } from 'node:perf_hooks';
import ipaddr from 'ipaddr.js';
import { RequestFilteringHttpAgent, RequestFilteringHttpsAgent } from 'request-filtering-agent';
import { hostProblem, isForbiddenAddress, isMetadataAddress, METADATA_ADDRESSES, unbracketHost } from './url-policy.ts';

export interface WebhookHttpRequest {
  url: string;
  headers: Record<string, string>;
  body: string;
  timeoutMs: number;
}

export interface WebhookHttpResult {
  /** True only for a 2xx answer. */
  ok: boolean;
  /** The answer's status, or null when none arrived. */
  statusCode: number | null;
  latencyMs: number;
  /** Why the attempt failed (at most ERROR_LENGTH_MAX characters), null when ok. */
  error: string | null;
  /** At most maxResponseBytes BYTES of the answer, cut on a UTF-8 boundary. */
  responseBody: string;
}

export interface WebhookSender {
  /** Never throws for network problems: every failure is a result with ok false. */
  send(request: WebhookHttpRequest): Promise<WebhookHttpResult>;
}

export interface WebhookSenderOptions {
  /** Allow private, loopback, link-local, … targets (sandbox and local development). Metadata addresses stay refused. */
  allowPrivate: boolean;
  /** Default `payments-webhooks/1`. */
  userAgent?: string;
  /** How much of the answer is kept; the rest is not read. Default 1024. */
  maxResponseBytes?: number;
  /** For tests and custom resolvers: resolves host names instead of `dns.lookup`. Its answers are checked like DNS ones. */
  lookup?: LookupFunction;
}

const RESPONSE_BYTES_MAX_DEFAULT = 1024;
const ERROR_LENGTH_MAX = 500;
const LOCATION_LENGTH_MAX = 200;
const DEFAULT_USER_AGENT = 'payments-webhooks/1';
/** Headers the sender owns: a caller setting them would break the message framing. */
const RESERVED_HEADERS = new Set(['content-length', 'transfer-encoding', 'host', 'connection']);
/** The agents' own refusal messages end like "… is not allowed. Because, It is private IP address." */
const AGENT_REFUSAL = /is not allowed\. Because/;

/** A target refused by this module's own checks (before connecting or in the resolver). */
class BlockedAddressError extends Error {
  override name = 'BlockedAddressError';
}

function truncate(text: string, lengthMax: number): string {
  return text.length <= lengthMax ? text : `${text.slice(0, lengthMax - 1)}…`;
}

/**
 * What the agent does not check itself: metadata addresses in every spelling (its deny list
 * compares strings, so `::ffff:169.254.169.254` would pass it when private targets are allowed),
 * and IPv6 addresses outside 2000::/3 that ipaddr.js nonetheless calls "unicast" (`::7f00:1`).
 * Everything else (private, loopback, …) is left to the agent, whose message names the reason.
 */
function resolvedAddressProblem(address: string, allowPrivate: boolean): string | null {
  if (isMetadataAddress(address)) return `${address} is a cloud metadata address`;
  if (
    !allowPrivate &&
    isIP(address) !== 0 &&
    ipaddr.parse(address).range() === 'unicast' &&
    isForbiddenAddress(address)
  ) {
    return `${address} is not a public address`;
  }
  return null;
}

function guardLookup(base: LookupFunction, allowPrivate: boolean): LookupFunction {
  return (hostname, options, callback) => {
    base(hostname, options, (error, address, family) => {
      if (error) {
        callback(error, address, family);
        return;
      }
      const addresses = Array.isArray(address) ? address.map((entry: LookupAddress) => entry.address) : [address];
      for (const candidate of addresses) {
        const problem = resolvedAddressProblem(candidate, allowPrivate);
        if (problem !== null) {
          callback(new BlockedAddressError(`${hostname} resolves to ${problem}`), address, family);
          return;
        }
      }
      callback(null, address, family);
    });
  };
}

function errorCode(error: unknown): string | undefined {
  const code = (error as NodeJS.ErrnoException | null)?.code;
  return typeof code === 'string' ? code : undefined;
}

/** A short, clear reason for a failed attempt. */
function describeError(error: unknown, hostname: string): string {
  if (error instanceof BlockedAddressError) return `blocked: ${error.message}`;
  if (error instanceof AggregateError && error.errors.length > 0) {
    // Happy Eyeballs (autoSelectFamily) tried several addresses: report the first failure.
    const first: unknown = error.errors[0];
    const others = error.errors.length - 1;
    return `${describeError(first, hostname)}${others > 0 ? ` (and ${others} other address${others > 1 ? 'es' : ''})` : ''}`;
  }
  if (!(error instanceof Error)) return `error: ${String(error)}`;
  if (AGENT_REFUSAL.test(error.message)) return `blocked: ${error.message}`;
  const code = errorCode(error);
  const detail = error as NodeJS.ErrnoException & { address?: string; port?: number };
  const target =
    detail.address === undefined ? hostname : `${detail.address}${detail.port === undefined ? '' : `:${detail.port}`}`;
  switch (code) {
    case 'ECONNREFUSED':
      return `connection refused (${target})`;
    case 'ENOTFOUND':
    case 'EAI_AGAIN':
    case 'EAI_FAIL':
    case 'EAI_NODATA':
      return `DNS lookup failed for ${hostname} (${code})`;
    case 'ECONNRESET':
      return `connection reset by ${hostname}`;
    case 'EHOSTUNREACH':
    case 'ENETUNREACH':
      return `host unreachable (${target}, ${code})`;
    default:
      break;
  }
  // OpenSSL errors carry `library` and a short `reason`; certificate errors only a code.
  const openssl = error as Error & { library?: unknown; reason?: unknown };
  if (
    typeof openssl.library === 'string' ||
    (code !== undefined && /^(EPROTO|ERR_TLS|ERR_SSL|ERR_OSSL)|CERT|SELF_SIGNED/.test(code))
  ) {
    // "write EPROTO 80…:error:0A00010B:SSL routines:ssl3_get_record:wrong version number:file:line:"
    const fromMessage = /:error:[0-9A-F]+:[^:]*:[^:]*:([^:]+):/.exec(error.message)?.[1];
    const reason = typeof openssl.reason === 'string' ? openssl.reason : (fromMessage ?? error.message.trim());
    return `TLS error: ${reason}${code === undefined ? '' : ` (${code})`}`;
  }
  return code === undefined ? error.message : `${error.message} (${code})`;
}

/** The longest prefix of `bytes` that does not end inside a UTF-8 sequence. */
function cutOnUtf8Boundary(bytes: Buffer): Buffer {
  let index = bytes.length - 1;
  let continuation = 0;
  while (index >= 0 && continuation < 3 && ((bytes[index] ?? 0) & 0xc0) === 0x80) {
    index -= 1;
    continuation += 1;
  }
  if (index < 0) return bytes;
  const lead = bytes[index] ?? 0;
  const needed = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 1;
  return bytes.length - index < needed ? bytes.subarray(0, index) : bytes;
}

/**
 * The kept answer as text PostgreSQL can store in `webhook_attempts.response_body` (at most
 * `bytesMax` bytes of UTF-8, no NUL), whether or not the answer was cut: a short answer of invalid
 * bytes grows when decoded (each becomes U+FFFD, 3 bytes), and a NUL byte is valid UTF-8 that a
 * text column refuses. Either used to fail the attempt's closing statement, so an answered attempt
 * was retried (sent again) by the activity.
 */
function decodeKept(bytes: Buffer, truncated: boolean, bytesMax: number): string {
  const text = (truncated ? cutOnUtf8Boundary(bytes) : bytes).toString('utf8').replaceAll('\u0000', '\uFFFD');
  if (Buffer.byteLength(text, 'utf8') <= bytesMax) return text;
  return cutOnUtf8Boundary(Buffer.from(text, 'utf8').subarray(0, bytesMax)).toString('utf8');
}

export function createWebhookSender(options: WebhookSenderOptions): WebhookSender {
  const maxResponseBytes = options.maxResponseBytes ?? RESPONSE_BYTES_MAX_DEFAULT;
  assert.ok(
    Number.isSafeInteger(maxResponseBytes) && maxResponseBytes >= 0,
    'maxResponseBytes must be a non-negative integer',
  );
  const userAgent = options.userAgent ?? DEFAULT_USER_AGENT;
  const allowPrivate = options.allowPrivate;
  // Denied even when private targets are allowed. The agent compares these as exact strings;
  // guardLookup and hostProblem catch the other spellings.
  const agentOptions = {
    keepAlive: true,
    allowPrivateIPAddress: allowPrivate,
    allowMetaIPAddress: false, // 0.0.0.0 and :: ("meta" here means unspecified, not cloud metadata)
    denyIPAddressList: [...METADATA_ADDRESSES],
  };
  const httpAgent = new RequestFilteringHttpAgent(agentOptions);
  const httpsAgent = new RequestFilteringHttpsAgent(agentOptions);
  const lookup = guardLookup(options.lookup ?? dnsLookup, allowPrivate);

  async function send(request: WebhookHttpRequest): Promise<WebhookHttpResult> {
    assert.ok(Number.isFinite(request.timeoutMs) && request.timeoutMs > 0, 'timeoutMs must be a positive number');
    const startedAt = performance.now();
    const elapsedMs = () => Math.round(performance.now() - startedAt);
    const failure = (error: string): WebhookHttpResult => ({
      ok: false,
      statusCode: null,
      latencyMs: elapsedMs(),
      error: truncate(error, ERROR_LENGTH_MAX),
      responseBody: '',
    });

    let url: URL;
    try {
      url = new URL(request.url);
    } catch {
      return failure('invalid URL');
    }
    if (url.protocol !== 'http:' && url.protocol !== 'https:') return failure(`invalid URL scheme ${url.protocol}`);
    const hostname = unbracketHost(url.hostname);
    const problem = hostProblem(hostname, allowPrivate);
    if (problem !== null) return failure(`blocked: ${problem}`);

    const body = Buffer.from(request.body, 'utf8');
    const headers: Record<string, string> = { 'content-type': 'application/json', 'user-agent': userAgent };
    for (const [name, value] of Object.entries(request.headers)) {
      const key = name.toLowerCase();
      assert.ok(!RESERVED_HEADERS.has(key), `the ${key} header is set by the sender`);
      headers[key] = value;
    }
    headers['content-length'] = String(body.length);

    return new Promise<WebhookHttpResult>((resolve) => {
      let settled = false;
      let statusCode: number | null = null;
      let location: string | undefined;
      const kept: Buffer[] = [];
      let keptBytes = 0;
      let truncated = false;
      let outgoing: http.ClientRequest | undefined;
      // One deadline for the whole attempt: connect, headers and body.
      const timer = setTimeout(() => {
        finish(`timeout after ${request.timeoutMs} ms`);
        outgoing?.destroy();
      }, request.timeoutMs);

      const finish = (error: string | null) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        const responseBody = decodeKept(Buffer.concat(kept, keptBytes), truncated, maxResponseBytes);
        // Node accepts any three-digit status; the attempt row (and HTTP) knows 100–599 only.
        if (statusCode !== null && (statusCode < 100 || statusCode > 599)) {
          error ??= `invalid HTTP status ${statusCode}`;
          statusCode = null;
        }
        if (error === null && statusCode !== null && statusCode >= 300 && statusCode < 400) {
          const target = location === undefined ? 'none' : truncate(location, LOCATION_LENGTH_MAX);
          error = `redirect not followed (Location: ${target})`;
        } else if (error === null && statusCode !== null && (statusCode < 200 || statusCode >= 300)) {
          error = `HTTP ${statusCode}`;
        }
        resolve({
          ok: error === null && statusCode !== null,
          statusCode,
          latencyMs: elapsedMs(),
          error: error === null ? null : truncate(error, ERROR_LENGTH_MAX),
          responseBody,
        });
      };

      try {
        outgoing = (url.protocol === 'https:' ? https : http).request(url, {
          method: 'POST',
          agent: url.protocol === 'https:' ? httpsAgent : httpAgent,
          headers,
          lookup,
        });
      } catch (error) {
        // Invalid header values and the like: reported, not thrown.
        clearTimeout(timer);
        settled = true;
        resolve(failure(`invalid request: ${error instanceof Error ? error.message : String(error)}`));
        return;
      }
      // These listeners stay attached after finish(): a late 'error' must never be unhandled.
      outgoing.on('error', (error) => finish(describeError(error, hostname)));
      outgoing.on('response', (response) => {
        statusCode = response.statusCode ?? null;
        location = response.headers.location;
        response.on('error', (error) => finish(describeError(error, hostname)));
        response.on('close', () =>
          finish(response.complete ? null : 'connection closed before the answer was complete'),
        );
        response.on('data', (chunk: Buffer) => {
          if (settled) return;
          const room = maxResponseBytes - keptBytes;
          if (chunk.length <= room) {
            kept.push(chunk);
            keptBytes += chunk.length;
            return;
          }
          // Enough: keep what fits and stop reading (the connection is not reused).
          kept.push(chunk.subarray(0, room));
          keptBytes += room;
          truncated = true;
          finish(null);
          response.destroy();
        });
        response.on('end', () => finish(null));
      });
      outgoing.end(body);
    });
  }

  return { send };
}
