//! A gateway linking `tollgate-node` and deciding requests in-process.
//!
//! `cargo run --release -p embedded-node` (its own package: building it changes no feature of
//! what the node binary built, so it rebuilds nothing but itself).

use tollgate_node::{Decision, NodeBuilder, Request};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let node = NodeBuilder::new()
        .rules_text(
            "domain: public-api\nrules:\n  - {id: per-key, match: {api_key: '*'}, algorithm: TOKEN_BUCKET, capacity: 5, refillPerSecond: 1}\n",
        )
        .start()
        .await?;

    // The general path: match the request against every rule, decide all or nothing.
    let request =
        Request::new("public-api").descriptor([("api_key", "k_123"), ("route", "GET /items")]);
    for i in 1..=7 {
        let verdict = node.check(&request).await?;
        match verdict.decisive() {
            Some(rule) if verdict.allowed => println!(
                "request {i}: allowed ({} left on {})",
                rule.remaining, rule.rule.id
            ),
            _ => println!("request {i}: 429, retry after {:?}", verdict.retry_after),
        }
    }

    // The hot path: resolve a request shape once, then decide it with atomics only while the
    // lease lasts (falling back to the full path when it does not).
    let mut prepared = node
        .prepare(Request::new("public-api").descriptor([("api_key", "k_456")]))
        .await?;
    for i in 1..=7 {
        match prepared.decide().await {
            Decision::Allowed => println!("prepared {i}: allowed"),
            Decision::Limited { retry_after } => {
                println!("prepared {i}: 429, retry after {retry_after:?}")
            }
        }
    }
    node.shutdown().await;
    Ok(())
}
