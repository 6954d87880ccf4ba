//! Signing in with an admin token, and out.

use askama::Template;
use axum::Extension;
use axum::body::Body;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};

use super::render;
use crate::console::{Console, Viewer, foreign_form, form_urlencoded_value, read_form};

#[derive(Template)]
#[template(path = "console/sign_in.html")]
struct SignInPage<'a> {
    error: Option<&'a str>,
}

pub(in crate::console) async fn sign_in_page() -> Response {
    render(&SignInPage { error: None }, StatusCode::OK)
}

pub(in crate::console) async fn sign_in(
    State(console): State<Console>,
    headers: axum::http::HeaderMap,
    body: Body,
) -> Response {
    if !crate::console::same_origin(&headers, console.admin.tls) {
        return foreign_form();
    }
    let form = match read_form(body, console.admin.client_timeout).await {
        Ok(form) => form,
        Err(refused) => return refused,
    };
    let token = form_urlencoded_value(&form, "token").unwrap_or_default();
    let presented = format!("Bearer {}", token.trim());
    let found = if console.admin.tokens.any() {
        console.admin.tokens.check(Some(&presented))
    } else {
        Some(("local".to_owned(), crate::auth::Access::Write))
    };
    let Some((name, access)) = found else {
        return render(
            &SignInPage {
                error: Some("that is not one of this node's admin tokens"),
            },
            StatusCode::UNAUTHORIZED,
        );
    };
    tracing::info!(token = %name, "console sign-in");
    let (_, cookie, _) = console.sessions.start(name, access);
    let mut response = Redirect::to("/console").into_response();
    response.headers_mut().append(header::SET_COOKIE, cookie);
    response
}

/// Signing out is a link: the session cookie is `SameSite=Strict`, so another site can
/// neither send it here nor end the session.
pub(in crate::console) async fn sign_out(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
) -> Response {
    let cookie = console.sessions.end(&viewer.id);
    let mut response = Redirect::to("/console/sign-in").into_response();
    response.headers_mut().append(header::SET_COOKIE, cookie);
    response
}
