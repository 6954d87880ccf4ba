//! Counter resets: each is written to its rule's history (who reset which identity's counter)
//! and announced to every node on [`RESET_CHANNEL`], so that each drops what it holds of the
//! bucket. A reset changes no rule: the rule set's revision stays.

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::error::ControlError;
use super::history::last_version;
use super::pool::RuleStore;

/// The channel nodes LISTEN on for counter resets; the payload is a [`ResetNotice`].
pub const RESET_CHANNEL: &str = "tollgate_counter_resets";

/// What nodes are told of one reset bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResetNotice {
    /// The rule part of the bucket's store key.
    pub rule_key: String,
    /// The identity, hex-encoded (an identity is bytes).
    pub identity_hex: String,
    /// Only the penalty block was lifted: nodes forget the block they know and keep the
    /// rest of the bucket.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub penalty_only: bool,
}

impl ResetNotice {
    /// The notice for `rule_key` and `identity`.
    pub fn new(rule_key: &str, identity: &[u8]) -> Self {
        Self {
            rule_key: rule_key.to_owned(),
            identity_hex: identity.iter().map(|b| format!("{b:02x}")).collect(),
            penalty_only: false,
        }
    }

    /// The notice of a lifted penalty block.
    pub fn lifted(rule_key: &str, identity: &[u8]) -> Self {
        Self {
            penalty_only: true,
            ..Self::new(rule_key, identity)
        }
    }

    /// The identity's bytes (None if the hex is malformed).
    pub fn identity(&self) -> Option<Vec<u8>> {
        let hex = self.identity_hex.as_bytes();
        if !hex.len().is_multiple_of(2) {
            return None;
        }
        hex.chunks(2)
            .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
            .collect()
    }
}

/// One reset bucket, as the history records it.
#[derive(Debug, Clone)]
pub struct ResetRecord {
    /// The rule's id (its history's).
    pub rule: String,
    /// The notice for the nodes.
    pub notice: ResetNotice,
    /// The domain of the descriptor.
    pub domain: String,
    /// The identity as text (lossy), for people reading the history.
    pub identity: String,
    /// Whether the store had anything of the bucket (a lift: whether a block was lifted).
    pub existed: bool,
}

impl ResetRecord {
    /// The history's name for it.
    fn change(&self) -> &'static str {
        if self.notice.penalty_only {
            "penalty-lifted"
        } else {
            "counter-reset"
        }
    }
}

impl RuleStore {
    /// Records resets in their rules' histories (change `counter-reset`, or `penalty-lifted`
    /// for a lift, by `actor`) and notifies the nodes, in one transaction.
    pub async fn record_resets(
        &self,
        resets: &[ResetRecord],
        actor: &str,
    ) -> Result<(), ControlError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let revision: i64 = tx
            .query_one("SELECT revision FROM rule_set_revision", &[])
            .await?
            .get(0);
        for reset in resets {
            let version = last_version(&tx, &reset.rule).await?;
            let detail = json!({
                "domain": reset.domain,
                "identity": reset.identity,
                "identityHex": reset.notice.identity_hex,
                "existed": reset.existed,
            });
            tx.execute(
                "INSERT INTO rate_limit_rule_history (rule_id, change, version, revision, changed_by, old_rule, new_rule)
                 VALUES ($1, $6, $2, $3, $4, NULL, $5)",
                &[&reset.rule, &version, &revision, &actor, &detail, &reset.change()],
            )
            .await?;
            let payload = serde_json::to_string(&reset.notice)
                .map_err(|e| ControlError::Database(e.to_string()))?;
            tx.execute("SELECT pg_notify($1, $2)", &[&RESET_CHANNEL, &payload])
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_survives_the_notice() {
        for identity in [&b""[..], b"k1", &[0u8, 255, 16, 1][..]] {
            let notice = ResetNotice::new("per-key", identity);
            assert_eq!(notice.identity().as_deref(), Some(identity));
        }
        let bad = ResetNotice {
            rule_key: "r".into(),
            identity_hex: "abc".into(),
            penalty_only: false,
        };
        assert_eq!(bad.identity(), None);
    }
}
