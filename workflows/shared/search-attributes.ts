import { defineSearchAttributeKey, SearchAttributeType } from '@temporalio/common';

// Custom search attributes that operators filter runs by in the Temporal Web UI. Registered on the
// dev server at start (bin/start.ts) and on a cluster by docker-compose's temporal-setup job.
export const SEARCH_ATTRIBUTES = {
  companyId: defineSearchAttributeKey('CompanyId', SearchAttributeType.KEYWORD),
  objectId: defineSearchAttributeKey('ObjectId', SearchAttributeType.KEYWORD),
  objectStatus: defineSearchAttributeKey('ObjectStatus', SearchAttributeType.KEYWORD),
  environment: defineSearchAttributeKey('Environment', SearchAttributeType.KEYWORD),
} as const;

/** `Name=Type` pairs in the form the Temporal CLI's --search-attribute flag takes. */
export const SEARCH_ATTRIBUTE_FLAGS: readonly string[] = Object.values(SEARCH_ATTRIBUTES).map(
  (key) => `${key.name}=Keyword`,
);
