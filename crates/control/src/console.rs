//! The operators' console, on the admin port under `/console`: the node's health, its rules
//! with the kill switch, and a customer's live counters with reset and lift, as HTML pages
//! rendered here (askama templates compiled into the binary, escaping every value) with one
//! small stylesheet and script embedded beside them. Nothing loads from elsewhere.
//!
//! It reads what the JSON API reads (the same [`AdminState`]) and acts through the same
//! functions, so a change made here is recorded, propagated and undone as one made there.
//!
//! Access is the admin API's: a person signs in with an admin token and gets a session
//! ([`session`]); a read token's pages have no forms that act. Every form that acts carries the
//! session's CSRF token, and a POST from another origin is refused before it is read. Every
//! response carries a Content-Security-Policy that allows no inline script or style. Without
//! an admin token the port listens on loopback only (as the API does) and whoever reaches it
//! acts as `local`. See `docs/console.md`.

pub mod chart;
mod pages;
pub mod session;

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};

use crate::admin::AdminState;
use chart::Outcomes;
use session::{Session, Sessions};

/// The largest form body the console reads.
pub const MAX_FORM_BYTES: usize = 16 * 1024;

/// The policy every console response carries: nothing but this origin's own files, no inline
/// script or style, no framing, forms posting only here.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; object-src 'none'; \
     frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

const STYLESHEET: &str = include_str!("console/assets/console.css");
const SCRIPT: &str = include_str!("console/assets/console.js");

/// What the console's pages share: the admin API's state, the sessions, and the chart's ring.
#[derive(Debug, Clone)]
struct Console {
    admin: AdminState,
    sessions: Arc<Sessions>,
    outcomes: Option<Arc<Outcomes>>,
}

/// The signed-in person a page is rendered for (set by [`gate`]).
#[derive(Debug, Clone)]
struct Viewer {
    /// The session's id (to end it).
    id: String,
    session: Session,
}

/// The console's router, on `/console`.
pub fn router(admin: AdminState) -> Router {
    let console = Console {
        sessions: Arc::new(Sessions::new(admin.tls)),
        outcomes: admin
            .node
            .as_ref()
            .map(|node| Outcomes::sample(node.clone())),
        admin,
    };
    let signed_in = Router::new()
        .route("/console", get(pages::overview))
        .route("/console/chart.svg", get(pages::chart))
        .route("/console/rules", get(pages::rules))
        .route("/console/rules/{id}", get(pages::rule))
        .route("/console/rules/{id}/mode", post(pages::set_mode))
        .route("/console/customer", get(pages::customer))
        .route("/console/customer/clear", post(pages::clear_counters))
        .route("/console/sign-out", get(pages::sign_out))
        .layer(middleware::from_fn_with_state(console.clone(), gate));
    Router::new()
        .route(
            "/console/sign-in",
            get(pages::sign_in_page).post(pages::sign_in),
        )
        .route(
            "/console/static/console.css",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
                    STYLESHEET,
                )
            }),
        )
        .route(
            "/console/static/console.js",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
                    SCRIPT,
                )
            }),
        )
        .merge(signed_in)
        .layer(middleware::from_fn(guard_headers))
        .with_state(console)
}

/// Adds the console's security headers to every response.
async fn guard_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
        (header::X_FRAME_OPTIONS, "DENY"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    headers.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    response
}

/// Whether a state-changing request comes from this console's own pages. A browser says so in
/// `Sec-Fetch-Site` (which no page can set): it must be `same-origin`. `Origin`, when it names
/// one, must be this host: under `Referrer-Policy: no-referrer` a browser sends `Origin: null`
/// even from the same origin, so `null` is left to `Sec-Fetch-Site`. A request with neither
/// header (not a browser's) passes to the CSRF token, which it must still present.
fn same_origin(headers: &HeaderMap, tls: bool) -> bool {
    let site = match headers.get("sec-fetch-site").map(HeaderValue::to_str) {
        Some(Ok(site)) => Some(site == "same-origin"),
        Some(Err(_)) => Some(false),
        None => None,
    };
    let origin = headers.get(header::ORIGIN).map(|origin| {
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
        let scheme = if tls { "https" } else { "http" };
        match (origin.to_str(), host) {
            (Ok("null"), _) => site == Some(true),
            (Ok(origin), Some(host)) => origin == format!("{scheme}://{host}"),
            _ => false,
        }
    });
    site.unwrap_or(true) && origin.unwrap_or(true)
}

/// The way into every signed-in page: the session the cookie names (without admin tokens, a
/// `local` session made on the spot: the port is on loopback only), then, for a POST, this
/// origin, a session that may act and the session's CSRF token in the form, in that order.
async fn gate(State(console): State<Console>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    let (viewer, new_cookie) = match console.sessions.of(&parts.headers) {
        Some((id, session)) => (Viewer { id, session }, None),
        None if !console.admin.tokens.any() => {
            let (session, cookie, id) = console
                .sessions
                .start("local".into(), crate::auth::Access::Write);
            (Viewer { id, session }, Some(cookie))
        }
        None if parts.method == Method::GET => {
            return Redirect::to("/console/sign-in").into_response();
        }
        None => {
            return pages::failure(
                StatusCode::UNAUTHORIZED,
                "Not signed in",
                "sign in with an admin token first",
            );
        }
    };
    let body = if parts.method == Method::POST {
        if !same_origin(&parts.headers, console.admin.tls) {
            return foreign_form();
        }
        if !viewer.session.may_act() && parts.uri.path() != "/console/sign-out" {
            return pages::failure(
                StatusCode::FORBIDDEN,
                "Read only",
                &format!(
                    "token {:?} is read-only: it may look, not act",
                    viewer.session.name
                ),
            );
        }
        let bytes = match read_form(body, console.admin.client_timeout).await {
            Ok(bytes) => bytes,
            Err(refused) => return refused,
        };
        let presented = form_urlencoded_value(&bytes, "csrf").unwrap_or_default();
        if !viewer.session.csrf_matches(&presented) {
            return pages::failure(
                StatusCode::FORBIDDEN,
                "Refused",
                "the form's CSRF token is missing or not this session's: reload the page",
            );
        }
        Body::from(bytes)
    } else {
        body
    };
    parts.extensions.insert(viewer);
    let mut response = next.run(Request::from_parts(parts, body)).await;
    if let Some(cookie) = new_cookie {
        response.headers_mut().append(header::SET_COOKIE, cookie);
    }
    response
}

/// The answer to a form sent from another origin.
fn foreign_form() -> Response {
    pages::failure(
        StatusCode::FORBIDDEN,
        "Refused",
        "this form was not sent from this console's own pages",
    )
}

/// A form's body, read whole: at most [`MAX_FORM_BYTES`], within the admin port's client
/// timeout (a client that sends a form slowly or without end holds nothing longer). Every
/// console POST is read here, signing in included.
async fn read_form(body: Body, timeout: std::time::Duration) -> Result<Bytes, Response> {
    match tokio::time::timeout(timeout, axum::body::to_bytes(body, MAX_FORM_BYTES)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(_)) => Err(pages::failure(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Too large",
            "the form is larger than the console reads",
        )),
        Err(_) => Err(pages::failure(
            StatusCode::REQUEST_TIMEOUT,
            "Too slow",
            "the form did not arrive in time",
        )),
    }
}

/// The value of `name` in a form body (`application/x-www-form-urlencoded`).
fn form_urlencoded_value(body: &[u8], name: &str) -> Option<String> {
    serde_urlencoded::from_bytes::<Vec<(String, String)>>(body)
        .ok()?
        .into_iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.insert(*name, HeaderValue::from_str(value).expect("value"));
        }
        h
    }

    /// A POST from this console's own origin passes; one from another site, another scheme or
    /// another port does not; without `Origin`, `Sec-Fetch-Site` decides.
    #[test]
    fn only_this_origin_may_post() {
        let host = ("host", "127.0.0.1:8082");
        assert!(same_origin(
            &headers(&[host, ("origin", "http://127.0.0.1:8082")]),
            false
        ));
        assert!(!same_origin(
            &headers(&[host, ("origin", "https://127.0.0.1:8082")]),
            false
        ));
        assert!(same_origin(
            &headers(&[host, ("origin", "https://127.0.0.1:8082")]),
            true
        ));
        assert!(!same_origin(
            &headers(&[host, ("origin", "http://evil.example")]),
            false
        ));
        assert!(!same_origin(
            &headers(&[host, ("origin", "http://127.0.0.1:8083")]),
            false
        ));
        assert!(!same_origin(&headers(&[host, ("origin", "null")]), false));
        let same_site = ("sec-fetch-site", "same-origin");
        assert!(same_origin(
            &headers(&[host, ("origin", "null"), same_site]),
            false
        ));
        assert!(!same_origin(
            &headers(&[host, ("origin", "http://evil.example"), same_site]),
            false
        ));
        assert!(!same_origin(
            &headers(&[host, ("sec-fetch-site", "cross-site")]),
            false
        ));
        assert!(same_origin(
            &headers(&[host, ("sec-fetch-site", "same-origin")]),
            false
        ));
        assert!(
            same_origin(&headers(&[host]), false),
            "not a browser: the CSRF token decides"
        );
    }
}
