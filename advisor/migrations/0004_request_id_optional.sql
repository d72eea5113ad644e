-- A request id is stored only when the log gives one (issue: ingest). Traces without ids (Azure,
-- BurstGPT, Mooncake) are identified by (import_id, line); a made-up id per row cost more than
-- the rest of the import to store (2M unique strings to compress).
ALTER TABLE requests ALTER COLUMN request_id DROP NOT NULL;
