import { pino, type Logger } from 'pino';

export type { Logger };

export function createLogger(options: { level: string; name: string }): Logger {
  return pino({
    name: options.name,
    level: options.level,
    base: { service: options.name, pid: process.pid },
    timestamp: pino.stdTimeFunctions.isoTime,
    redact: {
      paths: ['req.headers.authorization', 'req.headers.cookie', '*.password', '*.secret', '*.token'],
      censor: '[redacted]',
    },
  });
}
