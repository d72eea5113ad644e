-- The REST service (issue 6): API keys, stored hashed, and background jobs.
CREATE TABLE api_keys (
    key_id     VARCHAR PRIMARY KEY,
    name       VARCHAR NOT NULL,
    key_hash   VARCHAR NOT NULL,
    created_at TIMESTAMP NOT NULL,
    revoked_at TIMESTAMP
);

CREATE TABLE jobs (
    job_id      VARCHAR PRIMARY KEY,
    kind        VARCHAR NOT NULL,
    status      VARCHAR NOT NULL,
    progress    DOUBLE NOT NULL,
    message     VARCHAR,
    params      JSON,
    result      JSON,
    error       VARCHAR,
    created_at  TIMESTAMP NOT NULL,
    started_at  TIMESTAMP,
    finished_at TIMESTAMP
);
