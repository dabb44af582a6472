// One file over 400 lines: every migration in order, one array (issue 40 moves them to one .sql file each).
/** A migration's statements: split where a semicolon ends a line, except inside a $$-quoted function body. */
export function statements(sql: string): string[] {
  const out: string[] = [];
  let current = '';
  sql.split('$$').forEach((piece, i) => {
    if (i % 2 === 1) return void (current += `$$${piece}$$`);
    const [first, ...rest] = piece.split(/;\s*\n/);
    current += first;
    for (const next of rest) {
      out.push(current);
      current = next;
    }
  });
  out.push(current);
  return out.map((st) => st.trim()).filter(Boolean);
}

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
  {
    version: 6,
    name: 'the validator: loss pathways, spot checks, flags, emission epochs, scores, settlements, payouts',
    sql: `
      -- Merge rounds are the rows of \`epochs\` (an early name); an emission epoch is a period of wall time
      -- whose emission is split among miners: \`settlements\` and below.
      -- A loss report keeps its pathway (one miner per stage) and the last stage's merge round when it
      -- arrived: CLASP compares pathways within a round.
      ALTER TABLE metrics ADD COLUMN pathway jsonb;
      ALTER TABLE metrics ADD COLUMN round integer;
      -- One validator replay of one miner's output for one sampled microbatch, against the stage's
      -- hash-agreed weights of the round it was processed in.
      CREATE TABLE spot_checks (
        id serial PRIMARY KEY,
        run_id integer NOT NULL REFERENCES runs(id),
        activation_id text NOT NULL,
        miner_id text NOT NULL,
        stage integer NOT NULL,
        kind text NOT NULL CHECK (kind IN ('forward', 'backward', 'loss')),
        reference_round integer NOT NULL,
        passed boolean NOT NULL,
        metrics jsonb NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now()
      );
      CREATE INDEX spot_checks_by_miner ON spot_checks (run_id, miner_id, created_at);
      -- Evidence against a miner, with a named reason; a flagged miner's quality is zero.
      CREATE TABLE flags (
        id serial PRIMARY KEY,
        run_id integer NOT NULL REFERENCES runs(id),
        miner_id text NOT NULL,
        kind text NOT NULL,
        reason text NOT NULL,
        evidence jsonb NOT NULL DEFAULT '{}',
        created_at timestamptz NOT NULL DEFAULT now()
      );
      CREATE INDEX flags_by_miner ON flags (run_id, miner_id, created_at);
      -- One row per settled emission epoch; its existence is what "settled" means (one transaction).
      CREATE TABLE settlements (
        run_id integer NOT NULL REFERENCES runs(id),
        epoch integer NOT NULL CHECK (epoch >= 0),
        starts_at timestamptz NOT NULL,
        ends_at timestamptz NOT NULL,
        emission bigint NOT NULL CHECK (emission >= 0),
        allocated bigint NOT NULL CHECK (allocated >= 0 AND allocated <= emission),
        merkle_root text,
        settled_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (run_id, epoch)
      );
      -- What each miner did in a settled epoch and why it earned what it earned.
      CREATE TABLE scores (
        run_id integer NOT NULL REFERENCES runs(id),
        epoch integer NOT NULL,
        miner_id text NOT NULL,
        stage integer,
        account text NOT NULL,
        work integer NOT NULL CHECK (work >= 0),
        quality double precision NOT NULL CHECK (quality >= 0 AND quality <= 1),
        score double precision NOT NULL CHECK (score >= 0),
        flagged boolean NOT NULL,
        breakdown jsonb NOT NULL DEFAULT '{}',
        PRIMARY KEY (run_id, epoch, miner_id),
        FOREIGN KEY (run_id, epoch) REFERENCES settlements (run_id, epoch)
      );
      -- The ledger's credit rows: an epoch's emission split over payout accounts (a linked address,
      -- else the miner id), each with its Merkle proof against the epoch's root.
      CREATE TABLE payouts (
        run_id integer NOT NULL REFERENCES runs(id),
        epoch integer NOT NULL,
        account text NOT NULL,
        amount bigint NOT NULL CHECK (amount > 0),
        miners jsonb NOT NULL,
        proof jsonb NOT NULL,
        PRIMARY KEY (run_id, epoch, account),
        FOREIGN KEY (run_id, epoch) REFERENCES settlements (run_id, epoch)
      );
    `,
  },
  {
    version: 7,
    name: 'flagged miners leave the pipeline',
    sql: `
      -- A miner the validator flagged is out of the stage map, merges and assignment (every query of
      -- active miners), and may not register again in this run.
      ALTER TABLE miners DROP CONSTRAINT miners_status_check;
      ALTER TABLE miners ADD CONSTRAINT miners_status_check CHECK (status IN ('active', 'left', 'dropped', 'flagged'));
      -- When each replica reported its merged weights (the database's clock, like receipts): its
      -- training with those weights starts then, before the round's last replica reports.
      ALTER TABLE epochs ADD COLUMN merged_at jsonb NOT NULL DEFAULT '{}';
      -- Work accounting refuses a payload already seen under another microbatch (a replay).
      CREATE INDEX receipts_by_payload ON receipts (run_id, payload_hash);
      CREATE INDEX metrics_by_time ON metrics (run_id, name, created_at);
      -- What the model writes now: the validator's continuation of a fixed prompt after merges.
      CREATE TABLE samples (
        id serial PRIMARY KEY,
        run_id integer NOT NULL REFERENCES runs(id),
        rounds jsonb NOT NULL,
        held_out_loss double precision,
        prompt text NOT NULL,
        text text NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now()
      );
    `,
  },
  {
    version: 8,
    name: 'rewards: payout links, one-use nonces, claims',
    sql: `
      -- A miner's payout address, signed for by the wallet and by the miner. Rows are never updated:
      -- relinking adds a row, and the miner's current link is its latest (payout_addresses).
      CREATE TABLE payout_links (
        id serial PRIMARY KEY,
        miner_id text NOT NULL,
        address text NOT NULL,
        nonce text NOT NULL UNIQUE,
        linked_at timestamptz NOT NULL DEFAULT now()
      );
      CREATE INDEX payout_links_by_miner ON payout_links (miner_id, id);
      CREATE INDEX payout_links_by_address ON payout_links (address);
      CREATE VIEW payout_addresses AS
        SELECT DISTINCT ON (miner_id) miner_id, address, linked_at FROM payout_links ORDER BY miner_id, id DESC;
      -- Every message a wallet signs carries a nonce issued here, with the message itself, used once.
      -- A row lives until its expiry (then it may be deleted: an unknown nonce is refused like a used one).
      CREATE TABLE nonces (
        nonce text PRIMARY KEY,
        purpose text NOT NULL CHECK (purpose IN ('link', 'claim')),
        address text NOT NULL,
        message text NOT NULL,
        expires_at timestamptz NOT NULL,
        used_at timestamptz,
        created_at timestamptz NOT NULL DEFAULT now()
      );
      CREATE INDEX nonces_by_expiry ON nonces (expires_at);
      -- The ledger's debit rows: a claim pays an address the whole of some of its epochs' payouts.
      CREATE TABLE claims (
        id serial PRIMARY KEY,
        address text NOT NULL,
        amount bigint NOT NULL CHECK (amount > 0),
        epochs jsonb NOT NULL,
        nonce text NOT NULL UNIQUE,
        created_at timestamptz NOT NULL,
        -- What the payout sink did (the default records the claim in this ledger only).
        payout jsonb NOT NULL
      );
      CREATE INDEX claims_by_address ON claims (address, id);
      -- One row per payout claimed. Its primary key is the double-pay guard: a payout (run, epoch,
      -- account) can be claimed once, whatever the code above it does. The claim row is written
      -- after its items (the payout sink runs in between), in the same transaction.
      CREATE TABLE claimed_items (
        run_id integer NOT NULL,
        epoch integer NOT NULL,
        account text NOT NULL,
        amount bigint NOT NULL CHECK (amount > 0),
        claim_id integer NOT NULL REFERENCES claims (id) DEFERRABLE INITIALLY DEFERRED,
        PRIMARY KEY (run_id, epoch, account),
        FOREIGN KEY (run_id, epoch, account) REFERENCES payouts (run_id, epoch, account)
      );
      CREATE INDEX claimed_items_by_account ON claimed_items (account);
      CREATE INDEX payouts_by_account ON payouts (account);
    `,
  },
  {
    version: 9,
    name: 'receipts refused for an unknown microbatch, by arrival',
    sql: `
      -- A refused receipt is not work, but the step it may stand for is real: the validator does
      -- not replay a miner as exact across a refusal of its own (jobs/spot-checks.ts).
      CREATE TABLE refused_receipts (
        run_id integer NOT NULL REFERENCES runs(id),
        miner_id text NOT NULL,
        activation_id text NOT NULL,
        direction text NOT NULL,
        created_at timestamptz NOT NULL
      );
      CREATE INDEX refused_receipts_by_miner ON refused_receipts (run_id, miner_id, created_at);
    `,
  },
  {
    version: 10,
    name: 'metrics by id, for paging',
    sql: `
      -- Every list the API returns is paged by a cursor; a metric's id is its place in its series
      -- (rows of one time can tie). Rows stored before get ids in the table's order.
      ALTER TABLE metrics ADD COLUMN id bigserial;
      CREATE INDEX metrics_by_id ON metrics (run_id, name, id);
    `,
  },
  {
    version: 11,
    name: 'whole-round audits: commitments, the audit draw, audits',
    sql: `
      -- What each replica committed with merge-ready, before it could know whether its round would be
      -- audited: its weights and optimizer state at the round's end, and when that arrived (clock.ts).
      CREATE TABLE round_commitments (
        run_id integer NOT NULL REFERENCES runs(id),
        stage integer NOT NULL,
        round integer NOT NULL,
        miner_id text NOT NULL,
        weights_hash text NOT NULL,
        optimizer_hash text NOT NULL,
        ready_at timestamptz NOT NULL,
        PRIMARY KEY (run_id, stage, round, miner_id)
      );
      -- The audit draw of each stage's round: the secret's commitment published when the round began,
      -- the secret itself revealed once the round closed (packages/incentives/src/audit-choice.ts).
      CREATE TABLE audit_rounds (
        run_id integer NOT NULL REFERENCES runs(id),
        stage integer NOT NULL,
        round integer NOT NULL,
        commitment text NOT NULL,
        secret text NOT NULL,
        rate double precision NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now(),
        revealed_at timestamptz,
        PRIMARY KEY (run_id, stage, round)
      );
      CREATE TABLE audits (
        id text PRIMARY KEY,
        run_id integer NOT NULL REFERENCES runs(id),
        stage integer NOT NULL,
        round integer NOT NULL,
        miner_id text NOT NULL,
        -- open → passed | failed | unanswered | abandoned (the miner left) | skipped (not the miner's fault: no checkpoint)
        status text NOT NULL,
        reason text,
        detail jsonb,
        deadline timestamptz NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now(),
        finished_at timestamptz,
        validator_ms integer,
        UNIQUE (run_id, stage, round, miner_id)
      );
      CREATE INDEX audits_by_miner ON audits (run_id, miner_id);
      CREATE INDEX audits_open ON audits (run_id, status);
      -- What each owner received from each sender in a merge (hash of the encoded slice), and the round's
      -- partition seed: an audit checks the contribution a miner sent against where its round leads.
      ALTER TABLE epochs ADD COLUMN seed integer;
      -- When each miner was given its current stage: an audited round that began when it took the stage up starts then.
      ALTER TABLE miners ADD COLUMN stage_since timestamptz NOT NULL DEFAULT now();
      CREATE TABLE contribution_receipts (
        run_id integer NOT NULL REFERENCES runs(id),
        stage integer NOT NULL,
        round integer NOT NULL,
        owner text NOT NULL,
        sender text NOT NULL,
        partition integer NOT NULL,
        hash text NOT NULL,
        PRIMARY KEY (run_id, stage, round, sender, partition, owner)
      );
    `,
  },
  {
    version: 12,
    name: 'each replica\'s weights after a merge, as it reported them',
    sql: `
      -- The hash each replica reported with \`merged\` (the majority's is merged_hash): an audit of its next
      -- round may start from these weights, its own, when they are not the majority's.
      ALTER TABLE epochs ADD COLUMN merged_hashes jsonb NOT NULL DEFAULT '{}';
    `,
  },
  {
    version: 13,
    name: 'each replica\'s committed merge contribution',
    sql: `
      -- The Merkle roots of what a replica will contribute to its merge, in either mode, sent with
      -- merge-ready (packages/swarm/src/allreduce/commitment.ts): owners take only slices they prove,
      -- and an audit compares the one of the merge's mode with where the round leads.
      ALTER TABLE round_commitments ADD COLUMN outer_root text, ADD COLUMN average_root text;
    `,
  },
  {
    version: 14,
    name: 'where each committed round began',
    sql: `
      -- The merge round and weights hash a replica's round started from, sent with merge-ready: an audit's
      -- record must start there, and it is what the audit replays from when the replica's report of that merge was lost.
      ALTER TABLE round_commitments ADD COLUMN start_round integer, ADD COLUMN start_hash text;
    `,
  },
  {
    version: 15,
    name: 'slices refused, and contributions clipped, named by their owners; the optimizer state a round began with',
    sql: `
      -- An owner refused a sender's slice: its proof did not lead to the root the sender committed with merge-ready.
      -- Both owners of the partition saying so flags the sender (COMMITMENT_MISMATCH).
      -- An owner's CenteredClip clipped a sender's contribution: both owners saying so draws the sender's round for an audit.
      ALTER TABLE merge_events DROP CONSTRAINT merge_events_kind_check;
      ALTER TABLE merge_events ADD CONSTRAINT merge_events_kind_check CHECK (kind IN ('dispute', 'hash-mismatch', 'missed', 'failed', 'commitment-mismatch', 'clipped'));
      -- The optimizer state's hash a replica's round started from, sent with merge-ready beside its weights': what an
      -- audit replays from when the coordinator holds no commitment of that replica for the round it started from.
      ALTER TABLE round_commitments ADD COLUMN start_optimizer text;
    `,
  },
  {
    version: 16,
    name: 'unproven miners are drawn at the run audit rate',
    sql: `
      -- The run's audit rate when the round's draw was committed (its rate may be lowered under the validator's
      -- backlog), and the replicas drawn at that full rate all the same: too few audits passed when the round closed.
      ALTER TABLE audit_rounds ADD COLUMN full_rate double precision, ADD COLUMN unproven jsonb;
    `,
  },
  {
    version: 17,
    name: 'active miners by stage',
    sql: `
      -- What the stage map, each stage's merge members and /api/status read (every second, and on every join or
      -- departure): the run's active miners, by stage, without a scan of everyone who ever joined.
      CREATE INDEX miners_active_by_stage ON miners (run_id, status, stage);
    `,
  },
  {
    version: 18,
    name: 'receipts by reporter',
    sql: `
      -- A spot check counts the inner steps a miner took since its last merge from its own gradient receipts
      -- (jobs/spot-checks.ts, stepsSince): since "-infinity" for a miner that never merged, which the index by
      -- time alone turns into a scan of every receipt of the run (query-plans.test.ts).
      CREATE INDEX receipts_by_reporter ON receipts (run_id, reporter, direction, created_at);
    `,
  },
  {
    version: 19,
    name: 'the connection a miner registered on',
    sql: `
      -- Several coordinator processes serve one run in scale-out mode: a miner that reconnects to another process
      -- while its old connection is still open on the first must not be marked gone when that one closes. A
      -- departure or a silent drop changes the row only while it still names the connection that registered it.
      ALTER TABLE miners ADD COLUMN connection text;
    `,
  },
  {
    version: 20,
    name: 'replays marked by the process running them',
    sql: `
      -- The process that took an audit's record marks it at every tick while it replays: one no process marked for a
      -- while (jobs/audits.ts, REPLAY_LOST_MS) went with its process, and is asked of its miner again.
      ALTER TABLE audits ADD COLUMN replay_seen timestamptz;
    `,
  },
  {
    version: 21,
    name: 'miners restarted under the same identity',
    sql: `
      -- The miner process a registration came from (register's instance): another one under the same key is a
      -- restart, whose optimizer state and round records are new (jobs/audits.ts, accounting.ts).
      ALTER TABLE miners ADD COLUMN instance text;
      -- Each restart: when, on which stage, and how many of its audits were open then (unanswerable by the new
      -- process: forfeited, and with them every unsettled epoch's work before the restart).
      CREATE TABLE miner_restarts (
        run_id integer NOT NULL REFERENCES runs(id),
        miner_id text NOT NULL,
        at timestamptz NOT NULL DEFAULT now(),
        stage integer NOT NULL,
        forfeited integer NOT NULL DEFAULT 0
      );
      CREATE INDEX miner_restarts_by_miner ON miner_restarts (run_id, miner_id, at);
    `,
  },
  {
    version: 22,
    name: 'room on each miners page for its heartbeat times',
    sql: `
      -- Every active miner's last_seen_at is rewritten every LIVENESS_FLUSH_MS (liveness.ts). On full pages each
      -- rewrite put the new row version on another page, and the embedded database has no autovacuum: with 10,000
      -- miners the table grew by a megabyte a flush (123 MB after 10 minutes), and the reads of it (the stage map, a
      -- registration's count of each stage) with it, until one took seconds. With half of each page free the new
      -- version stays on its page (a HOT update: last_seen_at is in no index) and the next access of the page prunes
      -- the old one: the table keeps its size (bench/results/load.json).
      ALTER TABLE miners SET (fillfactor = 50);
    `,
  },
  {
    version: 23,
    name: 'each miner measured upload rate',
    sql: `
      -- An audit's deadline follows the record's size and its miner's upload rate, as measured on its last record's
      -- upload (jobs/audits.ts, auditDeadlineMs): what that upload held and how fast it came.
      ALTER TABLE miners ADD COLUMN upload_bytes_per_sec double precision;
      ALTER TABLE miners ADD COLUMN record_bytes integer;
    `,
  },
  {
    version: 24,
    name: 'each stage load, and who joined or left it, kept as miners change',
    sql: `
      -- Each stage's active miners and their summed throughput, kept by the triggers below whatever changes a miner's
      -- row (a registration, a departure, a drop, a flag, a move): a registration, a departure's check that every
      -- stage is still held and /api/status read a row per stage instead of counting every active miner (issue 41).
      CREATE TABLE stage_loads (
        run_id integer NOT NULL REFERENCES runs(id),
        stage integer NOT NULL,
        miners integer NOT NULL DEFAULT 0,
        tokens_per_sec double precision NOT NULL DEFAULT 0,
        PRIMARY KEY (run_id, stage)
      );
      -- Every change of who holds a stage (a miner becoming active on it, or ceasing to: a departure, a drop, a flag, a
      -- move), logged by the same triggers, in the order the changes were made to each miner. The stage map's publisher
      -- (stage-map.ts) takes what was logged since it last looked, instead of reading every active miner at each publish.
      CREATE TABLE stage_changes (
        id bigserial PRIMARY KEY,
        run_id integer NOT NULL,
        stage integer NOT NULL,
        miner_id text NOT NULL,
        joined boolean NOT NULL
      );
      CREATE INDEX stage_changes_by_run ON stage_changes (run_id, id);
      -- Both kept once per statement, from the rows it changed: a heartbeat batch (every active miner's last_seen_at) changes no
      -- load or holder and writes nothing; the stages' rows are written in order, so two statements never wait on each other crosswise.
      CREATE FUNCTION stage_loads_follow() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        IF TG_OP = 'INSERT' THEN
          INSERT INTO stage_loads AS l (run_id, stage, miners, tokens_per_sec)
            SELECT run_id, stage, count(*)::int, sum(tokens_per_sec::float8) FROM new_rows WHERE status = 'active' GROUP BY run_id, stage ORDER BY run_id, stage
            ON CONFLICT (run_id, stage) DO UPDATE SET miners = l.miners + EXCLUDED.miners, tokens_per_sec = l.tokens_per_sec + EXCLUDED.tokens_per_sec;
          INSERT INTO stage_changes (run_id, stage, miner_id, joined) SELECT run_id, stage, id, true FROM new_rows WHERE status = 'active' ORDER BY id;
        ELSIF TG_OP = 'UPDATE' THEN
          INSERT INTO stage_loads AS l (run_id, stage, miners, tokens_per_sec)
            SELECT run_id, stage, sum(n)::int, sum(t) FROM (
              SELECT run_id, stage, -1 AS n, -tokens_per_sec::float8 AS t FROM old_rows WHERE status = 'active'
              UNION ALL SELECT run_id, stage, 1, tokens_per_sec::float8 FROM new_rows WHERE status = 'active'
            ) d GROUP BY run_id, stage HAVING sum(n) <> 0 OR sum(t) <> 0 ORDER BY run_id, stage
            ON CONFLICT (run_id, stage) DO UPDATE SET miners = l.miners + EXCLUDED.miners, tokens_per_sec = l.tokens_per_sec + EXCLUDED.tokens_per_sec;
          -- A row that stayed active on the same stage (a heartbeat, a new speed) is no change of who holds it.
          INSERT INTO stage_changes (run_id, stage, miner_id, joined)
            SELECT o.run_id, o.stage, o.id, false FROM old_rows o
            LEFT JOIN new_rows n ON n.id = o.id AND n.status = 'active' AND n.stage = o.stage AND n.run_id = o.run_id
            WHERE o.status = 'active' AND n.id IS NULL ORDER BY o.id;
          INSERT INTO stage_changes (run_id, stage, miner_id, joined)
            SELECT n.run_id, n.stage, n.id, true FROM new_rows n
            LEFT JOIN old_rows o ON o.id = n.id AND o.status = 'active' AND o.stage = n.stage AND o.run_id = n.run_id
            WHERE n.status = 'active' AND o.id IS NULL ORDER BY n.id;
        ELSE
          INSERT INTO stage_loads AS l (run_id, stage, miners, tokens_per_sec)
            SELECT run_id, stage, -count(*)::int, -sum(tokens_per_sec::float8) FROM old_rows WHERE status = 'active' GROUP BY run_id, stage ORDER BY run_id, stage
            ON CONFLICT (run_id, stage) DO UPDATE SET miners = l.miners + EXCLUDED.miners, tokens_per_sec = l.tokens_per_sec + EXCLUDED.tokens_per_sec;
          INSERT INTO stage_changes (run_id, stage, miner_id, joined) SELECT run_id, stage, id, false FROM old_rows WHERE status = 'active' ORDER BY id;
        END IF;
        RETURN NULL;
      END $$;
      CREATE TRIGGER stage_loads_on_insert AFTER INSERT ON miners REFERENCING NEW TABLE AS new_rows
        FOR EACH STATEMENT EXECUTE FUNCTION stage_loads_follow();
      CREATE TRIGGER stage_loads_on_update AFTER UPDATE ON miners REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
        FOR EACH STATEMENT EXECUTE FUNCTION stage_loads_follow();
      CREATE TRIGGER stage_loads_on_delete AFTER DELETE ON miners REFERENCING OLD TABLE AS old_rows
        FOR EACH STATEMENT EXECUTE FUNCTION stage_loads_follow();
      INSERT INTO stage_loads (run_id, stage, miners, tokens_per_sec)
        SELECT run_id, stage, count(*)::int, coalesce(sum(tokens_per_sec::float8), 0) FROM miners WHERE status = 'active' GROUP BY run_id, stage;
    `,
  },
  // The function is restated whole, its INSERT and DELETE branches as migration 24 wrote them: PL/pgSQL replaces a
  // function whole, and a migration that has shipped is never edited.
  {
    version: 25,
    name: 'who joined or left a stage, found without a join of the changed rows',
    sql: `
      -- Migration 24 found the rows that left or joined a stage by joining old_rows to new_rows. PL/pgSQL plans that
      -- statement once, for the sizes of the transition tables it first saw (a registration's one row: a nested loop), and
      -- keeps the plan: every heartbeat batch of N rows then compared N × N (1.75 s at 3,000 miners, each flush holding the
      -- embedded database's one thread, bench:load's heartbeat p99 1.4 s). Each miner's (run, stage) holdings are summed
      -- instead, −1 for an old active row and +1 for a new one: what does not cancel left (−1) or joined (+1). Grouping is
      -- O(N) or O(N log N) whatever the plan. Departures before arrivals, each by id, as before.
      CREATE OR REPLACE FUNCTION stage_loads_follow() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        IF TG_OP = 'INSERT' THEN
          INSERT INTO stage_loads AS l (run_id, stage, miners, tokens_per_sec)
            SELECT run_id, stage, count(*)::int, sum(tokens_per_sec::float8) FROM new_rows WHERE status = 'active' GROUP BY run_id, stage ORDER BY run_id, stage
            ON CONFLICT (run_id, stage) DO UPDATE SET miners = l.miners + EXCLUDED.miners, tokens_per_sec = l.tokens_per_sec + EXCLUDED.tokens_per_sec;
          INSERT INTO stage_changes (run_id, stage, miner_id, joined) SELECT run_id, stage, id, true FROM new_rows WHERE status = 'active' ORDER BY id;
        ELSIF TG_OP = 'UPDATE' THEN
          INSERT INTO stage_loads AS l (run_id, stage, miners, tokens_per_sec)
            SELECT run_id, stage, sum(n)::int, sum(t) FROM (
              SELECT run_id, stage, -1 AS n, -tokens_per_sec::float8 AS t FROM old_rows WHERE status = 'active'
              UNION ALL SELECT run_id, stage, 1, tokens_per_sec::float8 FROM new_rows WHERE status = 'active'
            ) d GROUP BY run_id, stage HAVING sum(n) <> 0 OR sum(t) <> 0 ORDER BY run_id, stage
            ON CONFLICT (run_id, stage) DO UPDATE SET miners = l.miners + EXCLUDED.miners, tokens_per_sec = l.tokens_per_sec + EXCLUDED.tokens_per_sec;
          INSERT INTO stage_changes (run_id, stage, miner_id, joined)
            SELECT run_id, stage, id, sum(n) > 0 FROM (
              SELECT run_id, stage, id, -1 AS n FROM old_rows WHERE status = 'active'
              UNION ALL SELECT run_id, stage, id, 1 FROM new_rows WHERE status = 'active'
            ) d GROUP BY run_id, stage, id HAVING sum(n) <> 0 ORDER BY sum(n) > 0, id;
        ELSE
          INSERT INTO stage_loads AS l (run_id, stage, miners, tokens_per_sec)
            SELECT run_id, stage, -count(*)::int, -sum(tokens_per_sec::float8) FROM old_rows WHERE status = 'active' GROUP BY run_id, stage ORDER BY run_id, stage
            ON CONFLICT (run_id, stage) DO UPDATE SET miners = l.miners + EXCLUDED.miners, tokens_per_sec = l.tokens_per_sec + EXCLUDED.tokens_per_sec;
          INSERT INTO stage_changes (run_id, stage, miner_id, joined) SELECT run_id, stage, id, false FROM old_rows WHERE status = 'active' ORDER BY id;
        END IF;
        RETURN NULL;
      END $$;
    `,
  },
];
