//! Migrations, embedded in the binary and applied at start, each once, in order. Concurrent
//! starts are serialised by an advisory lock.

use tokio_postgres::Client;

/// Every migration, in order.
pub const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "rules", include_str!("../migrations/0001_rules.sql")),
    (
        2,
        "mode_overrides",
        include_str!("../migrations/0002_mode_overrides.sql"),
    ),
    (
        3,
        "penalties",
        include_str!("../migrations/0003_penalties.sql"),
    ),
    (
        4,
        "precedence",
        include_str!("../migrations/0004_precedence.sql"),
    ),
];

/// An arbitrary constant: the advisory lock that serialises migrations.
const LOCK: i64 = 0x746f_6c6c_6761_7465; // "tollgate"

/// Applies the migrations not applied yet. Returns how many were applied.
pub async fn migrate(client: &mut Client) -> Result<usize, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK])
        .await?;
    // `IF NOT EXISTS` on a schema that exists makes PostgreSQL send a NOTICE ("relation …
    // already exists, skipping"), which the client logs on every import and export: this
    // transaction hears warnings and worse only.
    tx.batch_execute("SET LOCAL client_min_messages = warning")
        .await?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS tollgate_schema_migrations (
             version INTEGER PRIMARY KEY,
             name TEXT NOT NULL,
             applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
    )
    .await?;
    let applied: Vec<i32> = tx
        .query("SELECT version FROM tollgate_schema_migrations", &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut count = 0;
    for (version, name, sql) in MIGRATIONS {
        if applied.contains(version) {
            continue;
        }
        tx.batch_execute(sql).await?;
        tx.execute(
            "INSERT INTO tollgate_schema_migrations (version, name) VALUES ($1, $2)",
            &[version, name],
        )
        .await?;
        tracing::info!(version, name, "applied migration");
        count += 1;
    }
    tx.commit().await?;
    Ok(count)
}
