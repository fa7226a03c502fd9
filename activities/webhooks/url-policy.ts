// Which webhook target URLs a tenant may register. This is the FIRST gate only: a DNS name can
// answer differently at delivery time, so the sender (http.ts) checks the address it actually
// connects to again, on every connection.
import { promises as dns } from 'node:dns';
import { isIP } from 'node:net';
import ipaddr from 'ipaddr.js';

export type WebhookUrlCheck =
  | { ok: true; url: string }
  | { ok: false; code: 'WEBHOOK_URL_INVALID' | 'WEBHOOK_URL_FORBIDDEN' | 'WEBHOOK_URL_UNRESOLVABLE'; message: string };

export interface WebhookUrlPolicy {
  /**
   * Lifts the address and host-name rules (private, loopback, `.local`, … targets allowed) and
   * allows `http:`. Never lifts the syntax rules, nor the refusal of cloud metadata addresses and
   * of the unspecified address (0.0.0.0, ::), which the delivery agent refuses too.
   */
  allowPrivate: boolean;
  /** `live` requires `https:`; `sandbox` also accepts `http:`. */
  environment: 'sandbox' | 'live';
  /** Resolves a host name to its addresses. Default: `dns.promises.lookup(h, { all: true, verbatim: true })`. */
  lookup?: (hostname: string) => Promise<string[]>;
}

const WEBHOOK_URL_LENGTH_MAX = 2048;
/** How long a host-name resolution may take before the URL counts as unresolvable. */
const WEBHOOK_URL_LOOKUP_TIMEOUT_MS = 5_000;

/**
 * Cloud instance-metadata endpoints: AWS/GCP/Azure/OpenStack (169.254.169.254), AWS over IPv6
 * (fd00:ec2::254), Alibaba (100.100.100.200). Refused even when private targets are allowed.
 */
export const METADATA_ADDRESSES: readonly string[] = ['169.254.169.254', 'fd00:ec2::254', '100.100.100.200'];
const metadataAddresses = METADATA_ADDRESSES.map((address) => ipaddr.parse(address));

const FORBIDDEN_NAME_SUFFIXES = ['.localhost', '.local', '.internal', '.home.arpa'];

/** IANA's global unicast block: every public IPv6 address lies in 2000::/3. */
const IPV6_GLOBAL_UNICAST = ipaddr.parseCIDR('2000::/3');

function parseAddress(address: string): ipaddr.IPv4 | ipaddr.IPv6 | null {
  // net.isIP accepts only the canonical dotted-quad and IPv6 forms; odd spellings (`0x7f.1`,
  // `2130706433`) are not addresses here (WHATWG URL has already normalized URL hosts).
  if (isIP(address) === 0) return null;
  try {
    return ipaddr.parse(address);
  } catch {
    return null;
  }
}

function ipv4FromInteger(value: number): ipaddr.IPv4 {
  return new ipaddr.IPv4([(value >>> 24) & 0xff, (value >>> 16) & 0xff, (value >>> 8) & 0xff, value & 0xff]);
}

/**
 * The IPv4 address an IPv6 address carries, for the translation and tunnelling ranges
 * (IPv4-mapped, NAT64 rfc6052, rfc6145, 6to4, Teredo, and the deprecated IPv4-compatible ::/96).
 */
function embeddedIPv4(address: ipaddr.IPv6): ipaddr.IPv4 | null {
  const parts = address.parts;
  const word = (index: number) => parts[index] ?? 0;
  const range = address.range();
  if (range === 'ipv4Mapped' || range === 'rfc6145' || range === 'rfc6052') {
    return ipv4FromInteger(((word(6) << 16) | word(7)) >>> 0);
  }
  if (range === '6to4') return ipv4FromInteger(((word(1) << 16) | word(2)) >>> 0);
  // Teredo: the client's IPv4 address is the last 32 bits, inverted.
  if (range === 'teredo') return ipv4FromInteger(~((word(6) << 16) | word(7)) >>> 0);
  if (parts.slice(0, 6).every((part) => part === 0)) return ipv4FromInteger(((word(6) << 16) | word(7)) >>> 0);
  return null;
}

function sameAddress(left: ipaddr.IPv4 | ipaddr.IPv6, right: ipaddr.IPv4 | ipaddr.IPv6): boolean {
  return left.kind() === right.kind() && left.toNormalizedString() === right.toNormalizedString();
}

/** A cloud metadata address, in any spelling (including embedded in an IPv6 address). */
export function isMetadataAddress(address: string): boolean {
  const parsed = parseAddress(address);
  if (parsed === null) return false;
  const candidates: (ipaddr.IPv4 | ipaddr.IPv6)[] = [parsed];
  if (parsed.kind() === 'ipv6') {
    const embedded = embeddedIPv4(parsed as ipaddr.IPv6);
    if (embedded !== null) candidates.push(embedded);
  }
  return candidates.some((candidate) => metadataAddresses.some((metadata) => sameAddress(candidate, metadata)));
}

/**
 * True for anything that is not a public unicast address: every special range ipaddr.js knows
 * (private, loopback, linkLocal, uniqueLocal, carrierGradeNat, reserved, multicast, unspecified,
 * broadcast, benchmarking, amt, as112, orchid2, discard, …), every IPv6 translation or tunnel
 * range (ipv4Mapped, rfc6052, rfc6145, 6to4, teredo: refused outright, whatever IPv4 address they
 * carry, because the delivery agent refuses them too), IPv6 outside 2000::/3 (ipaddr.js calls
 * `::7f00:1` "unicast"), the metadata addresses, and strings that are not an IP address at all.
 */
export function isForbiddenAddress(address: string): boolean {
  const parsed = parseAddress(address);
  if (parsed === null) return true;
  if (parsed.range() !== 'unicast') return true;
  if (parsed.kind() === 'ipv6' && !(parsed as ipaddr.IPv6).match(IPV6_GLOBAL_UNICAST)) return true;
  return isMetadataAddress(address);
}

/** The address rule that holds even when private targets are allowed. */
function isAlwaysForbiddenAddress(address: string): boolean {
  const parsed = parseAddress(address);
  return parsed === null || parsed.range() === 'unspecified' || isMetadataAddress(address);
}

/** Refused unless private targets are allowed: `localhost` and the local-only suffixes. */
function isForbiddenHostName(hostname: string): boolean {
  const name = hostname.toLowerCase().replace(/\.+$/, '');
  return name === 'localhost' || FORBIDDEN_NAME_SUFFIXES.some((suffix) => name.endsWith(suffix));
}

/** A URL `hostname` without the brackets of an IPv6 literal. */
export function unbracketHost(hostname: string): string {
  return hostname.startsWith('[') && hostname.endsWith(']') ? hostname.slice(1, -1) : hostname;
}

/**
 * Why a host (a WHATWG-normalized URL hostname, brackets removed) may not be contacted without
 * resolving it, or null. Shared with the sender, which applies it before each connection.
 */
export function hostProblem(host: string, allowPrivate: boolean): string | null {
  if (isIP(host) !== 0) {
    if (allowPrivate ? isAlwaysForbiddenAddress(host) : isForbiddenAddress(host)) {
      return isMetadataAddress(host) ? `${host} is a cloud metadata address` : `${host} is not a public address`;
    }
    return null;
  }
  if (!allowPrivate && isForbiddenHostName(host)) return `${host} is a local-only host name`;
  return null;
}

function invalid(message: string): WebhookUrlCheck {
  return { ok: false, code: 'WEBHOOK_URL_INVALID', message };
}

function forbidden(message: string): WebhookUrlCheck {
  return { ok: false, code: 'WEBHOOK_URL_FORBIDDEN', message };
}

async function defaultLookup(hostname: string): Promise<string[]> {
  const answers = await dns.lookup(hostname, { all: true, verbatim: true });
  return answers.map((answer) => answer.address);
}

async function resolveWithTimeout(
  lookup: (hostname: string) => Promise<string[]>,
  hostname: string,
): Promise<string[]> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new Error(`no answer within ${WEBHOOK_URL_LOOKUP_TIMEOUT_MS} ms`)),
      WEBHOOK_URL_LOOKUP_TIMEOUT_MS,
    );
  });
  try {
    return await Promise.race([lookup(hostname), timeout]);
  } finally {
    clearTimeout(timer);
  }
}

function describeLookupError(error: unknown): string {
  if (error instanceof Error) {
    const code = (error as NodeJS.ErrnoException).code;
    return typeof code === 'string' ? code : error.message.slice(0, 200);
  }
  return String(error).slice(0, 200);
}

/** Checks a webhook target URL at registration time. Returns the normalized URL when accepted. */
export async function checkWebhookUrl(raw: string, policy: WebhookUrlPolicy): Promise<WebhookUrlCheck> {
  if (raw.length > WEBHOOK_URL_LENGTH_MAX) return invalid(`URL is longer than ${WEBHOOK_URL_LENGTH_MAX} characters`);
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    // WHATWG URL refuses a port above 65535 outright: name that rather than "not a URL".
    const port = /^[a-z][a-z0-9+.-]*:\/\/[^/?#\s]*:(\d+)(?:[/?#]|$)/i.exec(raw)?.[1];
    if (port !== undefined && Number(port) > 65535) return invalid('URL port must be between 1 and 65535');
    return invalid('not an absolute URL');
  }
  const normalized = url.toString();
  if (normalized.length > WEBHOOK_URL_LENGTH_MAX) {
    return invalid(`URL is longer than ${WEBHOOK_URL_LENGTH_MAX} characters once normalized`);
  }
  const httpAllowed = policy.environment === 'sandbox' || policy.allowPrivate;
  if (url.protocol !== 'https:' && !(url.protocol === 'http:' && httpAllowed)) {
    return invalid(httpAllowed ? 'URL scheme must be https or http' : 'URL scheme must be https');
  }
  if (url.username !== '' || url.password !== '') return invalid('URL must not contain a user name or password');
  // `hash` is '' for both "no fragment" and an empty one ("…/#"); the serialization tells them apart.
  if (normalized.includes('#')) return invalid('URL must not contain a fragment');
  // WHATWG URL already refuses ports above 65535 and drops the scheme's default port.
  if (url.port === '0') return invalid('URL port must be between 1 and 65535');
  if (url.hostname === '') return invalid('URL has no host');

  const host = unbracketHost(url.hostname);
  const problem = hostProblem(host, policy.allowPrivate);
  if (problem !== null) return forbidden(`URL host is not allowed: ${problem}`);
  if (isIP(host) !== 0) return { ok: true, url: normalized };

  let addresses: string[];
  try {
    addresses = await resolveWithTimeout(policy.lookup ?? defaultLookup, host);
  } catch (error) {
    return {
      ok: false,
      code: 'WEBHOOK_URL_UNRESOLVABLE',
      message: `URL host ${host} could not be resolved (${describeLookupError(error)})`,
    };
  }
  if (addresses.length === 0) {
    return {
      ok: false,
      code: 'WEBHOOK_URL_UNRESOLVABLE',
      message: `URL host ${host} could not be resolved (no addresses)`,
    };
  }
  // A name with ANY forbidden answer is refused: the resolver may hand out either one later.
  for (const address of addresses) {
    const refused = policy.allowPrivate ? isAlwaysForbiddenAddress(address) : isForbiddenAddress(address);
    if (refused) {
      const why = isMetadataAddress(address) ? 'a cloud metadata address' : 'not a public address';
      return forbidden(`URL host ${host} resolves to ${address}, which is ${why}`);
    }
  }
  return { ok: true, url: normalized };
}
