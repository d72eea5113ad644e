-- Calibration runs, every replayed request, and each segment's spec-decode counter deltas
-- (issue 4). A run is written in one transaction: its three parts appear together or not at all.
CREATE SEQUENCE calibration_id_seq START 1;

CREATE TABLE calibrations (
    id             BIGINT PRIMARY KEY,
    created_at     TIMESTAMP NOT NULL,
    finished_at    TIMESTAMP NOT NULL,
    status         VARCHAR NOT NULL CHECK (status IN ('complete', 'partial')),
    stop_reason    VARCHAR,            -- why a partial run ended (interrupted, --max-minutes, ...)
    gpu            VARCHAR NOT NULL,
    vllm_version   VARCHAR,            -- from the servers' /version
    target         VARCHAR NOT NULL,
    draft          VARCHAR,
    method         VARCHAR NOT NULL,
    k              INTEGER NOT NULL,
    settings       JSON NOT NULL,      -- command-line settings, server URLs/args, filters, bands
    profile        JSON NOT NULL,      -- the fitted advisor Profile (advisor.profile.Profile)
    fit            JSON NOT NULL,      -- goodness of fit of the acceptance and step-cost models
    notes          VARCHAR
);

CREATE TABLE calibration_samples (
    calibration_id BIGINT NOT NULL,
    segment_key    VARCHAR NOT NULL,
    role           VARCHAR NOT NULL CHECK (role IN ('baseline', 'speculative')),
    seq            INTEGER NOT NULL,   -- order within (segment, role)
    request_id     VARCHAR,            -- the logged request it replays, when there is one
    task           VARCHAR,
    temperature    DOUBLE,
    prompt_tokens  INTEGER,
    max_tokens     INTEGER,
    concurrency    INTEGER,
    ttft_ms        DOUBLE,
    tpot_ms        DOUBLE,
    e2e_ms         DOUBLE,
    output_tokens  INTEGER,
    ok             BOOLEAN NOT NULL,
    error          VARCHAR
);

CREATE TABLE calibration_segments (
    calibration_id         BIGINT NOT NULL,
    segment_key            VARCHAR NOT NULL,
    task                   VARCHAR,
    temperature            DOUBLE,
    prompt_tokens          DOUBLE,   -- median of the replayed requests
    output_tokens          DOUBLE,
    concurrency            INTEGER,
    n_requests             INTEGER NOT NULL,
    num_drafts             BIGINT,
    num_draft_tokens       BIGINT,
    num_accepted_tokens    BIGINT,
    accepted_per_pos       JSON,     -- accepted-token counts per draft position
    acceptance_rate        DOUBLE,   -- accepted / draft tokens
    mean_acceptance_length DOUBLE,   -- 1 + accepted / drafts
    alpha                  DOUBLE,   -- per-token acceptance over all decode steps (drafted or not)
    text_features          JSON,
    baseline_tpot_ms       DOUBLE,
    speculative_tpot_ms    DOUBLE,
    baseline_e2e_ms        DOUBLE,
    speculative_e2e_ms     DOUBLE,
    PRIMARY KEY (calibration_id, segment_key)
);
