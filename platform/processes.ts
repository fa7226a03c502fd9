import { execFileSync, type ChildProcess } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';

/** True while `pid` exists, including when it belongs to another user (EPERM: e.g. the postgres user). */
export function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** Live descendants of `pid`, through `ps` (itself excluded). */
export function descendants(pid: number): { pid: number; command: string }[] {
  const table = execFileSync('ps', ['-e', '-o', 'pid=,ppid=,comm='], { encoding: 'utf8' })
    .trim()
    .split('\n')
    .map((line) => {
      const [child, parent, ...command] = line.trim().split(/\s+/);
      return { pid: Number(child), ppid: Number(parent), command: command.join(' ') };
    });
  const found: { pid: number; command: string }[] = [];
  const queue = [pid];
  while (queue.length > 0) {
    const parent = queue.shift()!;
    for (const row of table) {
      if (row.ppid === parent && row.command !== 'ps') {
        found.push({ pid: row.pid, command: row.command });
        queue.push(row.pid);
      }
    }
  }
  return found;
}

/**
 * SIGKILLs a child process, with `group` its whole process group (a child started detached leads its
 * own), and resolves once the child has exited. Returns the pids of the child and of its descendants
 * just before the kill, for a caller that checks later that none of them outlived it.
 */
export async function killAndTrack(
  service: { child: ChildProcess; exited: Promise<unknown> },
  options: { group: boolean },
): Promise<number[]> {
  const { child } = service;
  if (!child.pid || child.exitCode !== null || child.signalCode !== null) return [];
  const pids = [child.pid, ...descendants(child.pid).map((entry) => entry.pid)];
  try {
    if (options.group) process.kill(-child.pid, 'SIGKILL');
    else child.kill('SIGKILL');
  } catch {
    child.kill('SIGKILL');
  }
  await service.exited;
  return pids;
}

/**
 * The live postmaster holding a PostgreSQL data folder, from its postmaster.pid (pid on line 1,
 * port on line 4); undefined when there is none or it is gone.
 */
export async function livePostmaster(pgdata: string): Promise<{ pid: number; port: number | undefined } | undefined> {
  const lines = (await readFile(join(pgdata, 'postmaster.pid'), 'utf8').catch(() => '')).split('\n');
  const pid = Number.parseInt(lines[0] ?? '', 10);
  if (!Number.isInteger(pid) || pid <= 0 || !processAlive(pid)) return undefined;
  const port = Number.parseInt(lines[3] ?? '', 10);
  return { pid, port: Number.isInteger(port) && port > 0 ? port : undefined };
}
