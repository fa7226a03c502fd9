import type { Logger } from '../platform/logger.ts';

/** Everything the HTTP app needs, injected: createApp reads no environment and opens no socket. */
export interface AppDeps {
  logger: Logger;
  /** Named dependency checks for /readyz; each resolves true when the dependency answers. */
  readiness: Record<string, () => Promise<boolean>>;
  limits: {
    bodyLimitBytes: number;
  };
}

declare module 'koa' {
  interface DefaultState {
    requestId: string;
    logger: Logger;
  }
}
