-- The request log, import provenance and rejected rows (issue: ingest).
CREATE SEQUENCE import_id_seq START 1;

CREATE TABLE imports (
    import_id     BIGINT PRIMARY KEY,
    file          VARCHAR NOT NULL,
    format        VARCHAR NOT NULL,
    checksum      VARCHAR NOT NULL UNIQUE,
    size_bytes    BIGINT NOT NULL,
    rows_read     BIGINT NOT NULL,
    rows_accepted BIGINT NOT NULL,
    rows_rejected BIGINT NOT NULL,
    options       JSON,
    started_at    TIMESTAMP NOT NULL,
    finished_at   TIMESTAMP NOT NULL
);

CREATE TABLE requests (
    request_id         VARCHAR NOT NULL,
    source             VARCHAR NOT NULL,
    import_id          BIGINT NOT NULL,
    line               BIGINT NOT NULL,
    arrival_ts         TIMESTAMP,
    finish_ts          TIMESTAMP,
    prompt_tokens      INTEGER NOT NULL,
    output_tokens      INTEGER,
    temperature        DOUBLE,
    top_p              DOUBLE,
    max_tokens         INTEGER,
    task               VARCHAR,
    model              VARCHAR,
    tenant             VARCHAR,
    concurrency        INTEGER,
    concurrency_source VARCHAR,
    ttft_ms            DOUBLE,
    e2e_ms             DOUBLE,
    prompt_text        VARCHAR,
    output_text        VARCHAR
);

CREATE TABLE rejects (
    import_id BIGINT NOT NULL,
    file      VARCHAR NOT NULL,
    line      BIGINT NOT NULL,
    reason    VARCHAR NOT NULL,
    raw       VARCHAR
);
