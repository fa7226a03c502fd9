-- Transactional outbox: a row written in the same transaction as a business change, naming the
-- Temporal workflow that must run for it. A relay (re)starts any row not yet dispatched, with the
-- same workflow ID, so a crash between the commit and the hand-off neither strands nor doubles a flow.
create table outbox (
  id             bigint generated always as identity primary key,
  company_id     text,
  workflow_type  text not null check (length(workflow_type) between 1 and 200),
  workflow_id    text not null check (length(workflow_id) between 1 and 1000),
  task_queue     text not null check (length(task_queue) between 1 and 200),
  payload        jsonb not null default '{}'::jsonb,
  created_at     timestamptz not null default now(),
  dispatched_at  timestamptz,
  attempts       integer not null default 0 check (attempts >= 0),
  last_error     text check (length(last_error) <= 2000),
  constraint outbox_workflow_id_unique unique (workflow_id),
  constraint outbox_dispatched_after_created check (dispatched_at is null or dispatched_at >= created_at)
);

create index outbox_pending_idx on outbox (created_at) where dispatched_at is null;
create index outbox_dispatched_idx on outbox (dispatched_at) where dispatched_at is not null;
