//! Helpers for tests of the admin API against a real PostgreSQL.

use serde_json::Value;
use tollgate_testkit::PostgresServer;
use tollgate_testkit::http::{Response, request};

pub async fn postgres() -> PostgresServer {
    tokio::task::spawn_blocking(PostgresServer::start)
        .await
        .expect("join")
        .expect("postgres starts")
}

/// An admin API call (blocking client, run off the runtime).
pub async fn call(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Response {
    call_raw(port, method, path, headers, body.map(str::as_bytes)).await
}

/// An admin API call with a body of any bytes.
pub async fn call_raw(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> Response {
    let (method, path, body) = (method.to_owned(), path.to_owned(), body.map(<[u8]>::to_vec));
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    tokio::task::spawn_blocking(move || {
        let h: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        request(port, &method, &path, &h, body.as_deref()).expect("admin request")
    })
    .await
    .expect("join")
}

/// A GET on the admin API, its body as JSON.
pub async fn get_json(port: u16, path: &str) -> Value {
    json_of(&call(port, "GET", path, &[], None).await)
}

pub fn json_of(r: &Response) -> Value {
    serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("not JSON ({e}): {r:?}"))
}

pub fn rule_path(id: &str) -> String {
    format!("/admin/v1/rate-limit-rules/{id}")
}
