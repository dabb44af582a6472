/** Schema migrations, applied in order, each once. Never edit one that has shipped: add another. */
export const MIGRATIONS: Array<{ version: number; name: string; sql: string }> = [
  {
    version: 1,
    name: 'runs, miners, epochs, checkpoints, receipts, metrics',
    sql: `
      CREATE TABLE runs (
        id serial PRIMARY KEY,
        name text NOT NULL UNIQUE,
        config jsonb NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now()
      );
      CREATE TABLE miners (
        id text PRIMARY KEY,
        run_id integer NOT NULL REFERENCES runs(id),
        public_key text NOT NULL,
        address text NOT NULL,
        backend text NOT NULL,
        tokens_per_sec real NOT NULL,
        stage integer NOT NULL,
        status text NOT NULL CHECK (status IN ('active', 'left', 'dropped')),
        registered_at timestamptz NOT NULL DEFAULT now(),
        last_seen_at timestamptz NOT NULL DEFAULT now(),
        UNIQUE (run_id, public_key)
      );
      CREATE TABLE epochs (
        run_id integer NOT NULL REFERENCES runs(id),
        stage integer NOT NULL,
        epoch integer NOT NULL,
        phase text NOT NULL CHECK (phase IN ('training', 'merging')),
        started_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (run_id, stage, epoch)
      );
      CREATE TABLE checkpoints (
        run_id integer NOT NULL REFERENCES runs(id),
        stage integer NOT NULL,
        epoch integer NOT NULL,
        hash text NOT NULL,
        bytes integer NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (run_id, stage, epoch)
      );
      CREATE TABLE receipts (
        run_id integer NOT NULL REFERENCES runs(id),
        epoch integer NOT NULL,
        activation_id text NOT NULL,
        direction text NOT NULL CHECK (direction IN ('activation', 'gradient')),
        from_miner text NOT NULL,
        to_miner text NOT NULL,
        reporter text NOT NULL,
        bytes integer NOT NULL,
        payload_hash text NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now(),
        -- One transfer = one microbatch crossing one boundary one way; each end confirms it once.
        UNIQUE (run_id, activation_id, direction, from_miner, to_miner, reporter)
      );
      CREATE TABLE metrics (
        run_id integer NOT NULL REFERENCES runs(id),
        epoch integer NOT NULL,
        name text NOT NULL,
        value double precision NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now()
      );
    `,
  },
  {
    version: 2,
    name: 'checkpoint contents and uploader',
    sql: `
      ALTER TABLE checkpoints ADD COLUMN miner_id text;
      ALTER TABLE checkpoints ADD COLUMN data bytea;
    `,
  },
  {
    version: 3,
    name: 'loss reports name their microbatch, once',
    sql: `
      ALTER TABLE metrics ADD COLUMN activation_id text;
      CREATE UNIQUE INDEX metrics_one_report_per_microbatch ON metrics (run_id, name, activation_id) WHERE activation_id IS NOT NULL;
    `,
  },
  {
    version: 4,
    name: 'merge rounds and the evidence they produce',
    sql: `
      ALTER TABLE epochs ADD COLUMN mode text;
      ALTER TABLE epochs ADD COLUMN participants jsonb;
      ALTER TABLE epochs ADD COLUMN merged_hash text;
      ALTER TABLE epochs ADD COLUMN ended_at timestamptz;
      CREATE TABLE merge_events (
        id serial PRIMARY KEY,
        run_id integer NOT NULL REFERENCES runs(id),
        stage integer NOT NULL,
        round integer NOT NULL,
        kind text NOT NULL CHECK (kind IN ('dispute', 'hash-mismatch', 'missed', 'failed')),
        -- The miner the event is about (a liar, a replica that diverged or missed the round).
        miner_id text,
        reporter text,
        detail jsonb NOT NULL DEFAULT '{}',
        created_at timestamptz NOT NULL DEFAULT now()
      );
      CREATE INDEX receipts_by_time ON receipts (run_id, direction, created_at);
    `,
  },
  {
    version: 5,
    name: 'merge rounds keep how many contributions CenteredClip clipped',
    sql: `
      -- Per reporting replica: contributions it clipped over the partitions it reduced.
      -- Each partition has two owners, so a clipped contribution is normally counted by both.
      ALTER TABLE epochs ADD COLUMN clipped jsonb;
    `,
  },
];
