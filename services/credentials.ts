import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { hash as argon2Hash, verify as argon2Verify } from '@node-rs/argon2';

export type ApiKeyEnvironment = 'sandbox' | 'live';

const BASE62 = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz';
const API_KEY_LOOKUP_LENGTH = 12;
const API_KEY_SECRET_LENGTH = 32; // 32 base62 characters: about 190 random bits
const API_KEY_PATTERN = /^sk_(sandbox|live)_([0-9A-Za-z]{12})([0-9A-Za-z]{32})$/;

/** Uniform base62 string from the CSPRNG (rejection sampling, no modulo bias). */
export function randomBase62(length: number): string {
  let out = '';
  while (out.length < length) {
    for (const byte of randomBytes(length * 2)) {
      if (byte < 248 && out.length < length) out += BASE62[byte % 62];
    }
  }
  return out;
}

export function sha256(value: string): Buffer {
  return createHash('sha256').update(value, 'utf8').digest();
}

export interface NewApiKeySecret {
  secret: string;
  lookup: string;
  secretHash: Buffer;
  last4: string;
}

export function generateApiKeySecret(environment: ApiKeyEnvironment): NewApiKeySecret {
  const lookup = randomBase62(API_KEY_LOOKUP_LENGTH);
  const secret = `sk_${environment}_${lookup}${randomBase62(API_KEY_SECRET_LENGTH)}`;
  return { secret, lookup, secretHash: sha256(secret), last4: secret.slice(-4) };
}

export function parseApiKey(secret: string): { environment: ApiKeyEnvironment; lookup: string } | undefined {
  const match = API_KEY_PATTERN.exec(secret);
  if (!match) return undefined;
  return { environment: match[1] as ApiKeyEnvironment, lookup: match[2]! };
}

export function hashesEqual(a: Buffer, b: Buffer): boolean {
  return a.length === b.length && timingSafeEqual(a, b);
}

const SESSION_TOKEN_PATTERN = /^sess_[A-Za-z0-9_-]{43}$/;

export function generateSessionToken(): { token: string; tokenHash: Buffer } {
  const token = `sess_${randomBytes(32).toString('base64url')}`;
  return { token, tokenHash: sha256(token) };
}

export function sessionTokenHash(token: string): Buffer | undefined {
  return SESSION_TOKEN_PATTERN.test(token) ? sha256(token) : undefined;
}

// argon2id with OWASP's recommended minimum (19 MiB, 2 passes, 1 lane), spelled out.
// `algorithm: 2` is Algorithm.Argon2id (a const enum, which isolated modules cannot import); the
// database refuses any stored hash that does not start with $argon2id$.
const ARGON2_OPTIONS = { algorithm: 2, memoryCost: 19_456, timeCost: 2, parallelism: 1, outputLen: 32 };
export const PASSWORD_MIN_LENGTH = 12;
export const PASSWORD_MAX_LENGTH = 256;

export function hashPassword(password: string): Promise<string> {
  return argon2Hash(password, ARGON2_OPTIONS);
}

/** A hash of nothing, verified when the email is unknown so both paths cost the same time. */
let dummyHash: Promise<string> | undefined;

export async function verifyPassword(passwordHash: string | undefined, password: string): Promise<boolean> {
  dummyHash ??= hashPassword(randomBase62(24));
  const target = passwordHash ?? (await dummyHash);
  const ok = await argon2Verify(target, password).catch(() => false);
  return passwordHash !== undefined && ok;
}

/** A strong random password for generated accounts (bootstrap). */
export function generatePassword(): string {
  return randomBase62(24);
}
