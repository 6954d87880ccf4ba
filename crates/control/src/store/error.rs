//! What goes wrong in the control plane, and what PostgreSQL said when it was PostgreSQL.

use tollgate_node::rules::native::FieldError;

/// What went wrong in the control plane.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ControlError {
    /// The rule is invalid.
    #[error("{0}")]
    Invalid(FieldError),
    /// The rule is invalid, in each of these fields (at least one).
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    InvalidFields(Vec<FieldError>),
    /// No such rule.
    #[error("no rule {0:?}")]
    NotFound(String),
    /// The precondition failed: the rule's version is not the one named.
    #[error("rule {id:?} is at version {current:?}; {expected}")]
    Stale {
        /// The rule.
        id: String,
        /// Its current version (None: it does not exist).
        current: Option<i64>,
        /// What the caller's precondition asked (`If-Match named 3`).
        expected: String,
    },
    /// The write would leave another rule naming one that is gone (a rule replaces it).
    #[error("{0}")]
    Conflict(String),
    /// PostgreSQL cannot be reached.
    #[error("the rule store is unavailable: {0}")]
    Unavailable(String),
    /// PostgreSQL refused something.
    #[error("rule store error: {0}")]
    Database(String),
}

/// What PostgreSQL said, in full: the server's own message for a database error (`database
/// "x" does not exist`, `password authentication failed for user "y"`), else the error and
/// its causes (`error connecting to server: Connection refused`). tokio-postgres's `Display`
/// alone says only "db error".
pub fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut text = format!("{}: {}", db.severity(), db.message());
        if let Some(detail) = db.detail() {
            text.push_str(&format!(" ({detail})"));
        }
        return text;
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(&format!(": {cause_text}"));
        }
        source = cause.source();
    }
    text
}

impl From<tokio_postgres::Error> for ControlError {
    fn from(e: tokio_postgres::Error) -> Self {
        let text = describe(&e);
        match e.as_db_error() {
            // The server answered: what it refused is the message (a missing database or a
            // failed authentication is not a passing outage, but the node keeps retrying).
            Some(_) if !e.is_closed() => ControlError::Database(text),
            _ => ControlError::Unavailable(text),
        }
    }
}

impl From<deadpool_postgres::PoolError> for ControlError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        match e {
            deadpool_postgres::PoolError::Backend(e) => ControlError::from(e),
            other => ControlError::Unavailable(other.to_string()),
        }
    }
}
