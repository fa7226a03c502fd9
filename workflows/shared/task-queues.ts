// Task-queue names are persisted in every workflow's history: choose them once, here.
export const TASK_QUEUES = {
  /** Default queue for the platform's flows (settlement, reviews, maintenance). */
  core: 'payments-core',
} as const;

export type TaskQueue = (typeof TASK_QUEUES)[keyof typeof TASK_QUEUES];
