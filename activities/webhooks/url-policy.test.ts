import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { checkWebhookUrl, isForbiddenAddress, isMetadataAddress } from './url-policy.ts';
import type { WebhookUrlPolicy } from './url-policy.ts';

/** A resolver that must not be reached (IP literals and refused names never resolve). */
const noLookup = async (hostname: string): Promise<string[]> => {
  throw new Error(`unexpected lookup of ${hostname}`);
};
const publicLookup = async (): Promise<string[]> => ['93.184.216.34', '2606:2800:220:1:248:1893:25c8:1946'];

const live: WebhookUrlPolicy = { allowPrivate: false, environment: 'live', lookup: publicLookup };
const sandbox: WebhookUrlPolicy = { allowPrivate: false, environment: 'sandbox', lookup: publicLookup };
const privateAllowed: WebhookUrlPolicy = { allowPrivate: true, environment: 'live', lookup: publicLookup };

describe('isForbiddenAddress', () => {
  const forbidden: [string, string][] = [
    ['10.0.0.1', 'private 10/8'],
    ['172.16.0.1', 'private 172.16/12'],
    ['172.31.255.255', 'private 172.16/12, top'],
    ['192.168.1.1', 'private 192.168/16'],
    ['100.64.0.1', 'carrier-grade NAT 100.64/10'],
    ['100.127.255.254', 'carrier-grade NAT, top'],
    ['0.0.0.0', 'unspecified'],
    ['0.1.2.3', '0/8'],
    ['127.0.0.1', 'loopback'],
    ['127.255.0.9', 'loopback /8'],
    ['169.254.1.1', 'link-local'],
    ['169.254.169.254', 'metadata (AWS, GCP, Azure)'],
    ['100.100.100.200', 'metadata (Alibaba)'],
    ['224.0.0.1', 'multicast'],
    ['255.255.255.255', 'broadcast'],
    ['240.0.0.1', 'reserved 240/4'],
    ['192.0.2.1', 'documentation TEST-NET-1'],
    ['198.18.0.1', 'benchmarking 198.18/15'],
    ['192.88.99.1', '6to4 relay anycast'],
    ['192.175.48.1', 'AS112'],
    ['192.52.193.1', 'AMT'],
    ['::', 'IPv6 unspecified'],
    ['::1', 'IPv6 loopback'],
    ['fc00::1', 'unique local fc00::/7'],
    ['fd12:3456::1', 'unique local fd00::/8'],
    ['fe80::1', 'IPv6 link-local'],
    ['fe80::1%eth0', 'IPv6 link-local with a zone'],
    ['fec0::1', 'deprecated site-local'],
    ['ff02::1', 'IPv6 multicast'],
    ['fd00:ec2::254', 'metadata (AWS IPv6)'],
    ['::ffff:10.0.0.1', 'IPv4-mapped private'],
    ['::ffff:127.0.0.1', 'IPv4-mapped loopback'],
    ['::ffff:93.184.216.34', 'IPv4-mapped public: refused outright, the delivery agent would refuse it too'],
    ['64:ff9b::7f00:1', 'NAT64 (rfc6052) of 127.0.0.1'],
    ['64:ff9b:1::1', 'NAT64 local-use'],
    ['::ffff:0:7f00:1', 'rfc6145'],
    ['2002:7f00:1::1', '6to4 of 127.0.0.1'],
    ['2001:0:4136:e378:8000:63bf:3fff:fdd2', 'Teredo'],
    ['2001:2::1', 'benchmarking'],
    ['2001:3::1', 'AMT'],
    ['2001:20::1', 'ORCHIDv2'],
    ['2001:db8::1', 'documentation'],
    ['100::1', 'discard-only'],
    ['::7f00:1', 'IPv4-compatible (ipaddr.js calls it unicast; outside 2000::/3)'],
    ['5f00::1', 'segment routing'],
    ['2130706433', 'not an address: odd IPv4 spellings are normalized by URL before this point'],
    ['0x7f.1', 'not an address'],
    ['example.com', 'not an address'],
    ['', 'empty'],
  ];
  for (const [address, why] of forbidden) {
    it(`refuses ${address || '""'} (${why})`, () => assert.equal(isForbiddenAddress(address), true));
  }

  const allowed = [
    '93.184.216.34',
    '8.8.8.8',
    '1.1.1.1',
    '100.63.255.255',
    '100.128.0.1',
    '172.32.0.1',
    '2606:4700::1111',
    '2a00:1450:4001::200e',
  ];
  for (const address of allowed) {
    it(`allows public ${address}`, () => assert.equal(isForbiddenAddress(address), false));
  }
});

describe('isMetadataAddress', () => {
  const metadata = [
    '169.254.169.254',
    '100.100.100.200',
    'fd00:ec2::254',
    'fd00:ec2:0:0:0:0:0:254',
    '::ffff:169.254.169.254',
    '::ffff:a9fe:a9fe',
    '64:ff9b::a9fe:a9fe',
    '2002:a9fe:a9fe::1',
    '::169.254.169.254',
  ];
  for (const address of metadata) {
    it(`recognizes ${address}`, () => assert.equal(isMetadataAddress(address), true));
  }
  for (const address of ['169.254.169.253', '10.0.0.1', '93.184.216.34', 'fd00:ec2::253']) {
    it(`does not flag ${address}`, () => assert.equal(isMetadataAddress(address), false));
  }
});

describe('checkWebhookUrl: syntax', () => {
  const invalid: [string, string, WebhookUrlPolicy][] = [
    ['not a url', 'relative / garbage', live],
    ['/hooks', 'relative', live],
    ['ftp://example.com/hook', 'other scheme', sandbox],
    ['javascript:alert(1)', 'javascript', sandbox],
    ['file:///etc/passwd', 'file', privateAllowed],
    ['http://example.com/hook', 'http in live', live],
    ['https://user:pass@example.com/hook', 'credentials', live],
    ['https://user@example.com/hook', 'user name only', live],
    ['https://:secret@example.com/hook', 'password only', live],
    ['https://example.com/hook#frag', 'fragment', live],
    ['https://example.com/hook#', 'empty fragment', live],
    ['https://example.com:0/hook', 'port 0', live],
    ['https://example.com:65536/hook', 'port above 65535', live],
    [`https://example.com/${'a'.repeat(2048)}`, 'too long', live],
    ['https://user:pass@localhost/hook', 'credentials, even with allowPrivate', privateAllowed],
    ['https://10.0.0.1/hook#x', 'fragment, even with allowPrivate', privateAllowed],
  ];
  for (const [raw, why, policy] of invalid) {
    it(`refuses ${raw.slice(0, 60)} (${why})`, async () => {
      const result = await checkWebhookUrl(raw, { ...policy, lookup: noLookup });
      assert.equal(result.ok, false);
      assert.equal(!result.ok && result.code, 'WEBHOOK_URL_INVALID', JSON.stringify(result));
    });
  }

  it('says a port above 65535 is out of range, not that the URL is not one', async () => {
    for (const raw of ['https://example.com:65536/hook', 'https://example.com:99999', 'http://[::1]:70000/x?y']) {
      const result = await checkWebhookUrl(raw, { ...privateAllowed, lookup: noLookup });
      assert.equal(!result.ok && result.message, 'URL port must be between 1 and 65535', raw);
    }
    const garbage = await checkWebhookUrl('https://exa mple.com:99999', { ...live, lookup: noLookup });
    assert.equal(!garbage.ok && garbage.message, 'not an absolute URL');
  });

  it('accepts https in live and returns the normalized URL', async () => {
    assert.deepEqual(await checkWebhookUrl('HTTPS://Example.COM:443/a/../hooks?x=1', live), {
      ok: true,
      url: 'https://example.com/hooks?x=1',
    });
  });

  it('accepts http in sandbox', async () => {
    assert.deepEqual(await checkWebhookUrl('http://example.com/hook', sandbox), {
      ok: true,
      url: 'http://example.com/hook',
    });
  });

  it('accepts http in live when private targets are allowed (local development)', async () => {
    assert.equal((await checkWebhookUrl('http://example.com/hook', privateAllowed)).ok, true);
  });

  it('accepts any port from 1 to 65535', async () => {
    for (const port of [1, 8443, 65535]) {
      assert.deepEqual(await checkWebhookUrl(`https://example.com:${port}/`, live), {
        ok: true,
        url: `https://example.com:${port}/`,
      });
    }
  });

  it('accepts a URL of exactly 2048 characters', async () => {
    const prefix = 'https://example.com/';
    const raw = prefix + 'a'.repeat(2048 - prefix.length);
    assert.deepEqual(await checkWebhookUrl(raw, live), { ok: true, url: raw });
  });
});

describe('checkWebhookUrl: hosts', () => {
  const forbiddenHosts: [string, string][] = [
    ['https://127.0.0.1/hook', 'loopback'],
    ['https://127.1/hook', 'short IPv4 spelling'],
    ['https://2130706433/hook', 'decimal IPv4 spelling'],
    ['https://0x7f.1/hook', 'hex IPv4 spelling'],
    ['https://0177.0.0.1/hook', 'octal IPv4 spelling'],
    ['https://0.0.0.0/hook', 'unspecified'],
    ['https://10.0.0.1/hook', 'private'],
    ['https://172.16.5.4/hook', 'private'],
    ['https://192.168.0.10/hook', 'private'],
    ['https://100.64.0.1/hook', 'carrier-grade NAT'],
    ['https://169.254.10.10/hook', 'link-local'],
    ['https://169.254.169.254/latest/meta-data/', 'metadata'],
    ['https://[::1]/hook', 'IPv6 loopback'],
    ['https://[fc00::1]/hook', 'unique local'],
    ['https://[fe80::1]/hook', 'link-local'],
    ['https://[::ffff:10.0.0.1]/hook', 'IPv4-mapped'],
    ['https://[::ffff:127.0.0.1]/hook', 'IPv4-mapped loopback'],
    ['https://[64:ff9b::7f00:1]/hook', 'NAT64 of loopback'],
    ['https://[fd00:ec2::254]/hook', 'AWS IPv6 metadata'],
    ['https://localhost/hook', 'localhost'],
    ['https://LOCALHOST./hook', 'localhost, upper case with a trailing dot'],
    ['https://api.localhost/hook', '.localhost'],
    ['https://printer.local/hook', '.local'],
    ['https://metadata.google.internal/computeMetadata/v1/', '.internal'],
    ['https://router.home.arpa/hook', '.home.arpa'],
  ];
  for (const [raw, why] of forbiddenHosts) {
    it(`refuses ${raw} (${why}) without resolving anything`, async () => {
      const result = await checkWebhookUrl(raw, { ...live, lookup: noLookup });
      assert.equal(!result.ok && result.code, 'WEBHOOK_URL_FORBIDDEN', JSON.stringify(result));
    });
  }

  it('allows public IP literals, v4 and v6', async () => {
    assert.deepEqual(await checkWebhookUrl('https://93.184.216.34/hook', { ...live, lookup: noLookup }), {
      ok: true,
      url: 'https://93.184.216.34/hook',
    });
    assert.deepEqual(await checkWebhookUrl('https://[2606:4700::1111]:8443/hook', { ...live, lookup: noLookup }), {
      ok: true,
      url: 'https://[2606:4700::1111]:8443/hook',
    });
  });

  it('does not confuse a public name that merely contains "local"', async () => {
    assert.equal((await checkWebhookUrl('https://localhost.example.com/hook', live)).ok, true);
    assert.equal((await checkWebhookUrl('https://internal.example.com/hook', live)).ok, true);
  });

  it('refuses a name with one private answer among public ones', async () => {
    const result = await checkWebhookUrl('https://hooks.example.com/x', {
      ...live,
      lookup: async () => ['93.184.216.34', '10.1.2.3', '2606:4700::1111'],
    });
    assert.equal(!result.ok && result.code, 'WEBHOOK_URL_FORBIDDEN');
    assert.match(!result.ok ? result.message : '', /hooks\.example\.com resolves to 10\.1\.2\.3/);
  });

  it('refuses a name that resolves to an IPv4-mapped loopback', async () => {
    const result = await checkWebhookUrl('https://hooks.example.com/x', {
      ...live,
      lookup: async () => ['::ffff:127.0.0.1'],
    });
    assert.equal(!result.ok && result.code, 'WEBHOOK_URL_FORBIDDEN');
  });

  it('passes the host name, without brackets or port, to the resolver', async () => {
    const asked: string[] = [];
    await checkWebhookUrl('https://Hooks.Example.com:8443/x', {
      ...live,
      lookup: async (hostname) => {
        asked.push(hostname);
        return ['93.184.216.34'];
      },
    });
    assert.deepEqual(asked, ['hooks.example.com']);
  });

  // Registration is only the first gate: the name may resolve differently (or at all) at delivery
  // time, and the sender re-checks the address of every connection (see http.test.ts).
  it('reports a resolution failure as UNRESOLVABLE', async () => {
    const result = await checkWebhookUrl('https://nowhere.example.com/x', {
      ...live,
      lookup: async () => {
        throw Object.assign(new Error('getaddrinfo ENOTFOUND nowhere.example.com'), { code: 'ENOTFOUND' });
      },
    });
    assert.deepEqual(result, {
      ok: false,
      code: 'WEBHOOK_URL_UNRESOLVABLE',
      message: 'URL host nowhere.example.com could not be resolved (ENOTFOUND)',
    });
  });

  it('reports an empty answer as UNRESOLVABLE', async () => {
    const result = await checkWebhookUrl('https://empty.example.com/x', { ...live, lookup: async () => [] });
    assert.equal(!result.ok && result.code, 'WEBHOOK_URL_UNRESOLVABLE');
  });

  it('uses the system resolver by default (a .invalid name never resolves)', async () => {
    const result = await checkWebhookUrl('https://webhook-target.invalid/x', {
      allowPrivate: false,
      environment: 'live',
    });
    assert.equal(!result.ok && result.code, 'WEBHOOK_URL_UNRESOLVABLE');
  });
});

describe('checkWebhookUrl: allowPrivate', () => {
  const allowedNow = [
    'http://127.0.0.1:8080/hook',
    'http://localhost:3000/hook',
    'https://10.0.0.1/hook',
    'https://[::1]/hook',
    'https://[fe80::1]/hook',
    'https://printer.local/hook',
    'https://svc.internal/hook',
    'https://2130706433/hook',
  ];
  for (const raw of allowedNow) {
    it(`lifts the address and name rules: ${raw}`, async () => {
      const result = await checkWebhookUrl(raw, { ...privateAllowed, lookup: async () => ['127.0.0.1', '::1'] });
      assert.equal(result.ok, true, JSON.stringify(result));
    });
  }

  // Decision: metadata addresses (and 0.0.0.0 / ::, which the delivery agent always refuses) stay
  // refused even when private targets are allowed; so do the syntax rules (tested above).
  const stillForbidden = [
    'http://169.254.169.254/latest/meta-data/',
    'http://100.100.100.200/latest/meta-data/',
    'http://[fd00:ec2::254]/latest/meta-data/',
    'http://[::ffff:169.254.169.254]/latest/meta-data/',
    'http://2852039166/latest/meta-data/',
    'http://0.0.0.0:8080/hook',
    'http://[::]:8080/hook',
  ];
  for (const raw of stillForbidden) {
    it(`still refuses ${raw}`, async () => {
      const result = await checkWebhookUrl(raw, { ...privateAllowed, lookup: noLookup });
      assert.equal(!result.ok && result.code, 'WEBHOOK_URL_FORBIDDEN', JSON.stringify(result));
    });
  }

  it('still refuses a name that resolves to a metadata address', async () => {
    const result = await checkWebhookUrl('http://imds.example.com/', {
      ...privateAllowed,
      lookup: async () => ['10.0.0.1', '169.254.169.254'],
    });
    assert.equal(!result.ok && result.code, 'WEBHOOK_URL_FORBIDDEN');
    assert.match(!result.ok ? result.message : '', /metadata/);
  });
});
