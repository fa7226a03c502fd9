// Signed transfers (DESIGN contracts 7 and 14): every transfer object carries a detached JWS
// (EdDSA / Ed25519) over the RFC 8785 canonical JSON of the object without its `signature` member.
//
// Keys live in `signing_keys` (platform data, no row-level security): exactly one `active` key signs,
// `retired` keys are kept so that signatures made before a rotation keep verifying, and all of them
// are published at /.well-known/jwks.json.
//
// Caching and rotation: each signer keeps the key set in memory for `cacheTtlMs` (default 60 s), so
// signing does not read the database each time. `rotate()` refreshes this instance's cache at once;
// other processes keep signing with the key they cached (now retired, still valid and still in the
// JWKS) until their cache expires, so every instance signs with the new key at most `cacheTtlMs`
// after a rotation. A verification whose `kid` is not in the cache reloads the key set once before
// it fails, so a signature made by another instance with a newer key verifies at once; jwks() reads
// the key set afresh for the same reason.
//
// The private JWK never leaves this module: it is read only for the active key and imported as a
// KeyObject kept in this closure; jwks() builds each public key from a fixed list of public members.
//
// Signing is on the hot path of every transfer response, so it is done synchronously with
// node:crypto (Ed25519 is deterministic: the same bytes jose's CompactSign produces, about 45 µs,
// where WebCrypto's asynchronous job costs about three times that plus a thread-pool round trip).
// Verification stays with jose.
import assert from 'node:assert/strict';
import { createPrivateKey, randomBytes, sign as ed25519Sign, type KeyObject } from 'node:crypto';
import canonicalize from 'canonicalize';
import { base64url, compactVerify, exportJWK, generateKeyPair, importJWK, type CryptoKey } from 'jose';
import { z } from 'zod';
import type { Sql, TransactionSql } from '../db/client.ts';

export const SIGNING_ALGORITHM = 'EdDSA';
export const SIGNING_CACHE_TTL_MS_DEFAULT = 60_000;
/** The property of a signed object that holds its signature; never part of the signed payload. */
export const SIGNATURE_MEMBER = 'signature';

const KID_PREFIX = 'tsk_';
/** 18 random bytes → 24 base64url characters. */
const KID_RANDOM_BYTES = 18;
const KID_PATTERN = /^tsk_[A-Za-z0-9_-]{24}$/;
/** A detached compact JWS of ours is about 160 characters; anything far longer is not one. */
const SIGNATURE_LENGTH_MAX = 1024;
const DETACHED_JWS_PATTERN = /^([A-Za-z0-9_-]+)\.\.([A-Za-z0-9_-]+)$/;

/** A public signing key as published in the JWKS (a type alias, so it is also a JSON value). */
export type SigningPublicJwk = {
  kty: 'OKP';
  crv: 'Ed25519';
  x: string;
  kid: string;
  alg: typeof SIGNING_ALGORITHM;
  use: 'sig';
};

export interface TransferSigner {
  /** Loads (or creates) the signing key; afterwards sign() never waits for the database. */
  warm(): Promise<void>;
  /** The compact detached JWS (`header..signature`) over `value` without its `signature` member. */
  sign(value: object): Promise<string>;
  /** True when `signature` is a valid detached JWS of `value` (without its `signature`) by one of our keys. */
  verify(value: object, signature: string): Promise<boolean>;
  /** Public keys only: the active one first, then retired ones, newest first. */
  jwks(): Promise<{ keys: SigningPublicJwk[] }>;
  /** Retires the active key (if any) and activates a new one, in one transaction. */
  rotate(): Promise<{ kid: string; retired: string | null }>;
}

export interface TransferSignerDeps {
  sql: Sql;
  /** How long the key set is cached in memory; other instances see a rotation within this time. */
  cacheTtlMs?: number;
}

const ZPublicJwk = z.object({ kty: z.literal('OKP'), crv: z.literal('Ed25519'), x: z.string().min(1) });
const ZPrivateJwk = ZPublicJwk.extend({ d: z.string().min(1) });
const ZProtectedHeader = z.strictObject({ alg: z.literal(SIGNING_ALGORITHM), kid: z.string().regex(KID_PATTERN) });

interface SigningKeyRow {
  kid: string;
  status: 'active' | 'retired';
  public_jwk: unknown;
  /** Selected for the active key only. */
  private_jwk: unknown;
}

interface VerificationKey {
  kid: string;
  publicJwk: SigningPublicJwk;
  key: CryptoKey;
}

interface ActiveKey {
  kid: string;
  key: KeyObject;
  /** The base64url protected header `{"alg":"EdDSA","kid":…}`, the same for every signature. */
  header: string;
}

interface KeySet {
  loadedAtMs: number;
  active: ActiveKey | undefined;
  /** Active first, then retired, newest first. */
  ordered: VerificationKey[];
  byKid: Map<string, VerificationKey>;
}

function newKid(): string {
  return `${KID_PREFIX}${randomBytes(KID_RANDOM_BYTES).toString('base64url')}`;
}

function publicJwkOf(kid: string, stored: unknown): SigningPublicJwk {
  const { kty, crv, x } = ZPublicJwk.parse(stored);
  // Built from named members only, so nothing private can be published by accident.
  return { kty, crv, x, kid, alg: SIGNING_ALGORITHM, use: 'sig' };
}

/** The bytes that are signed: the canonical JSON of the object without its signature member. */
function signingInput(value: object): Uint8Array {
  return new TextEncoder().encode(canonicalJson(value));
}

function canonicalJson(value: object): string {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw new TypeError('only a JSON object can be signed');
  }
  const { [SIGNATURE_MEMBER]: _signature, ...unsigned } = value as Record<string, unknown>;
  const canonical = canonicalize(unsigned);
  if (canonical === undefined) throw new TypeError('the object has no JSON representation');
  return canonical;
}

function activeKeyOf(kid: string, privateJwk: unknown): ActiveKey {
  const { kty, crv, x, d } = ZPrivateJwk.parse(privateJwk);
  return {
    kid,
    key: createPrivateKey({ key: { kty, crv, x, d }, format: 'jwk' }),
    header: Buffer.from(JSON.stringify({ alg: SIGNING_ALGORITHM, kid })).toString('base64url'),
  };
}

async function generateSigningKey() {
  const kid = newKid();
  const { privateKey, publicKey } = await generateKeyPair(SIGNING_ALGORITHM, { crv: 'Ed25519', extractable: true });
  const publicJwk = publicJwkOf(kid, await exportJWK(publicKey));
  const exported = ZPrivateJwk.parse(await exportJWK(privateKey));
  const privateJwk = { ...exported, kid, alg: SIGNING_ALGORITHM };
  return { kid, publicJwk, privateJwk };
}

async function insertSigningKey(
  sql: Sql | TransactionSql,
  key: Awaited<ReturnType<typeof generateSigningKey>>,
  onConflict: 'fail' | 'ignore',
): Promise<boolean> {
  const values = {
    kid: key.kid,
    algorithm: SIGNING_ALGORITHM,
    public_jwk: sql.json(key.publicJwk),
    private_jwk: sql.json(key.privateJwk),
    status: 'active',
  };
  const rows =
    onConflict === 'ignore'
      ? await sql`
          insert into signing_keys ${sql(values, 'kid', 'algorithm', 'public_jwk', 'private_jwk', 'status')}
          on conflict do nothing
          returning kid`
      : await sql`
          insert into signing_keys ${sql(values, 'kid', 'algorithm', 'public_jwk', 'private_jwk', 'status')}
          returning kid`;
  return rows.length === 1;
}

export function createTransferSigner(deps: TransferSignerDeps): TransferSigner {
  const { sql } = deps;
  const cacheTtlMs = deps.cacheTtlMs ?? SIGNING_CACHE_TTL_MS_DEFAULT;
  assert.ok(Number.isFinite(cacheTtlMs) && cacheTtlMs >= 0, 'cacheTtlMs must be a finite number ≥ 0');

  let cache: KeySet | undefined;
  /** Loads are numbered when they start; a load never replaces the result of one that started later. */
  let loadsStarted = 0;
  let installedLoad = 0;
  let pendingRefresh: Promise<KeySet> | undefined;
  let pendingCreate: Promise<KeySet> | undefined;

  /** Reads every key; CryptoKeys already imported are reused (a kid's key material never changes). */
  async function loadFresh(): Promise<KeySet> {
    const loadNumber = (loadsStarted += 1);
    const rows = await sql<SigningKeyRow[]>`
      select kid, status, public_jwk,
             case when status = 'active' then private_jwk end as private_jwk
        from signing_keys
       order by status = 'active' desc, created_at desc, kid`;
    const previous = cache;
    const ordered: VerificationKey[] = [];
    let active: KeySet['active'];
    for (const row of rows) {
      const known = previous?.byKid.get(row.kid);
      const publicJwk = known?.publicJwk ?? publicJwkOf(row.kid, row.public_jwk);
      const key = known?.key ?? (await importJWK(publicJwk, SIGNING_ALGORITHM));
      ordered.push({ kid: row.kid, publicJwk, key });
      if (row.status === 'active') {
        active = previous?.active?.kid === row.kid ? previous.active : activeKeyOf(row.kid, row.private_jwk);
      }
    }
    const loaded: KeySet = {
      loadedAtMs: performance.now(),
      active,
      ordered,
      byKid: new Map(ordered.map((entry) => [entry.kid, entry])),
    };
    if (loadNumber > installedLoad) {
      installedLoad = loadNumber;
      cache = loaded;
    }
    return loaded;
  }

  /** A reload that joins one already under way (concurrent callers share one query). */
  function refresh(): Promise<KeySet> {
    pendingRefresh ??= loadFresh().finally(() => {
      pendingRefresh = undefined;
    });
    return pendingRefresh;
  }

  /**
   * The cached key set. Once loaded it is served even when stale, while a refresh runs in the
   * background: Shape B signs its response before its one statement, and should not wait for a
   * round trip there; webhook delivery signs inside its attempt's transaction, where waiting for a
   * second connection of the same pool could deadlock a busy pool. Only the very first load waits
   * (the API warms its signer before it listens).
   */
  async function currentKeys(): Promise<KeySet> {
    if (!cache) return refresh();
    if (performance.now() - cache.loadedAtMs >= cacheTtlMs) void refresh().catch(() => undefined);
    return cache;
  }

  /**
   * Makes a key active when there is none. Race-safe: the partial unique index admits one active
   * key, a losing insert does nothing, and the re-read returns whichever key won.
   */
  function createActiveKey(): Promise<KeySet> {
    pendingCreate ??= (async () => {
      await insertSigningKey(sql, await generateSigningKey(), 'ignore');
      return loadFresh();
    })().finally(() => {
      pendingCreate = undefined;
    });
    return pendingCreate;
  }

  async function activeKey(): Promise<ActiveKey> {
    const keys = await currentKeys();
    if (keys.active) return keys.active;
    const created = await createActiveKey();
    assert.ok(created.active, 'a signing key is active after creating one');
    return created.active;
  }

  async function verificationKey(kid: string): Promise<VerificationKey | undefined> {
    const known = (await currentKeys()).byKid.get(kid);
    if (known) return known;
    // A key made by another instance since this cache was loaded: look once more.
    return (await refresh()).byKid.get(kid);
  }

  return {
    async warm() {
      await activeKey();
    },
    async sign(value) {
      const payload = Buffer.from(canonicalJson(value), 'utf8').toString('base64url');
      const { key, header } = await activeKey();
      // RFC 7515: the signature is over ASCII(BASE64URL(header) '.' BASE64URL(payload)).
      const signature = ed25519Sign(null, Buffer.from(`${header}.${payload}`, 'ascii'), key).toString('base64url');
      return `${header}..${signature}`;
    },

    async verify(value, signature) {
      // Malformed input is a failed verification; an unreachable database is an error, not `false`.
      if (typeof signature !== 'string' || signature.length > SIGNATURE_LENGTH_MAX) return false;
      const match = DETACHED_JWS_PATTERN.exec(signature);
      if (!match) return false;
      const [, header = '', signatureValue = ''] = match;
      let kid: string;
      let payload: Uint8Array;
      try {
        const decoded: unknown = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(base64url.decode(header)));
        kid = ZProtectedHeader.parse(decoded).kid;
        payload = signingInput(value);
      } catch {
        return false;
      }
      const key = await verificationKey(kid);
      if (!key) return false;
      try {
        await compactVerify(`${header}.${base64url.encode(payload)}.${signatureValue}`, key.key, {
          algorithms: [SIGNING_ALGORITHM],
        });
        return true;
      } catch {
        return false;
      }
    },

    async jwks() {
      // Always the database's key set (one query, shared by concurrent callers), never this
      // instance's cache: another process (the worker signing webhook payloads, another API
      // instance, the CLI's `keys rotate`) may already sign with a key this cache has not seen, and
      // a verifier that fetches the JWKS for an unknown kid must find it here.
      let keys = await refresh();
      if (keys.ordered.length === 0) keys = await createActiveKey();
      return { keys: keys.ordered.map((entry) => ({ ...entry.publicJwk })) };
    },

    async rotate() {
      const next = await generateSigningKey();
      const retired = await sql.begin(async (tx) => {
        // Serialises rotations (and waits for a first key being created); readers are not blocked.
        await tx`lock table signing_keys in share row exclusive mode`;
        const rows = await tx<{ kid: string }[]>`
          update signing_keys
             set status = 'retired', retired_at = now()
           where status = 'active'
          returning kid`;
        await insertSigningKey(tx, next, 'fail');
        return rows[0]?.kid ?? null;
      });
      await loadFresh();
      return { kid: next.kid, retired };
    },
  };
}
