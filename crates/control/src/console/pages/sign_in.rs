//! Signing in with an admin token, and out.

use askama::Template;
use axum::Extension;
use axum::extract::rejection::FormRejection;
use axum::extract::{Form, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::{failure, render};
use crate::console::{Console, Viewer};

#[derive(Template)]
#[template(path = "console/sign_in.html")]
struct SignInPage<'a> {
    error: Option<&'a str>,
}

pub(in crate::console) async fn sign_in_page() -> Response {
    render(&SignInPage { error: None }, StatusCode::OK)
}

#[derive(Debug, Deserialize)]
pub(in crate::console) struct SignInForm {
    token: String,
}

pub(in crate::console) async fn sign_in(
    State(console): State<Console>,
    headers: axum::http::HeaderMap,
    form: Result<Form<SignInForm>, FormRejection>,
) -> Response {
    if !crate::console::same_origin(&headers, console.admin.tls) {
        return failure(
            StatusCode::FORBIDDEN,
            "Refused",
            "this form was not sent from this console's own pages",
        );
    }
    let Ok(Form(form)) = form else {
        return render(
            &SignInPage {
                error: Some("the form did not arrive whole; sign in again"),
            },
            StatusCode::BAD_REQUEST,
        );
    };
    let presented = format!("Bearer {}", form.token.trim());
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
