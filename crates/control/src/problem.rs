//! Errors as RFC 9457 problem details (`application/problem+json`).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// One field that is wrong.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct FieldProblem {
    /// The field (`capacity`, `match.route`, `body`).
    pub field: String,
    /// Why.
    pub reason: String,
}

/// A problem to report.
#[derive(Debug, Clone, Serialize)]
pub struct Problem {
    /// A URI naming the kind of problem.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// A short summary of the kind.
    pub title: &'static str,
    /// The HTTP status.
    pub status: u16,
    /// What happened this time.
    pub detail: String,
    /// The fields at fault, if any.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldProblem>,
    #[serde(skip)]
    www_authenticate: bool,
    /// The methods a 405 names (its `Allow` header).
    #[serde(skip)]
    allow: Option<&'static str>,
}

impl Problem {
    fn new(
        status: StatusCode,
        kind: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            kind,
            title,
            status: status.as_u16(),
            detail: detail.into(),
            errors: vec![],
            www_authenticate: false,
            allow: None,
        }
    }

    /// With an `Allow` header (a 405): `allowed` is a comma-separated list of methods.
    pub fn with_allow(mut self, allowed: &'static str) -> Self {
        self.allow = Some(allowed);
        self
    }

    /// 400: the rule (or body) is invalid; names the field.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        let (field, reason) = (field.into(), reason.into());
        let mut p = Self::new(
            StatusCode::BAD_REQUEST,
            "urn:tollgate:problem:invalid-rule",
            "The rule is invalid",
            format!("field `{field}`: {reason}"),
        );
        p.errors.push(FieldProblem { field, reason });
        p
    }

    /// 400: the rule is invalid in each of `fields` (field, reason), all of them listed in
    /// `errors` (the detail names the first, and how many more).
    pub fn invalid_all(fields: impl IntoIterator<Item = (String, String)>) -> Self {
        let errors: Vec<FieldProblem> = fields
            .into_iter()
            .map(|(field, reason)| FieldProblem { field, reason })
            .collect();
        let detail = match errors.as_slice() {
            [] => "the rule is invalid".to_owned(),
            [one] => format!("field `{}`: {}", one.field, one.reason),
            [first, rest @ ..] => format!(
                "field `{}`: {} (and {} more in errors)",
                first.field,
                first.reason,
                rest.len()
            ),
        };
        let mut p = Self::new(
            StatusCode::BAD_REQUEST,
            "urn:tollgate:problem:invalid-rule",
            "The rule is invalid",
            detail,
        );
        p.errors = errors;
        p
    }

    /// 400: a header or the query string is malformed (not the rule).
    pub fn bad_request(
        title: &'static str,
        field: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        let (field, reason) = (field.into(), reason.into());
        let mut p = Self::new(
            StatusCode::BAD_REQUEST,
            "urn:tollgate:problem:bad-request",
            title,
            format!("{field}: {reason}"),
        );
        p.errors.push(FieldProblem { field, reason });
        p
    }

    /// 405: the path exists, the method does not.
    pub fn method_not_allowed(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "urn:tollgate:problem:method-not-allowed",
            "Method not allowed",
            detail,
        )
    }

    /// 408: the client took too long to send its request.
    pub fn too_slow(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "urn:tollgate:problem:request-timeout",
            "The request took too long to arrive",
            detail,
        )
    }

    /// 401: no valid bearer token.
    pub fn unauthorized(detail: impl Into<String>) -> Self {
        let mut p = Self::new(
            StatusCode::UNAUTHORIZED,
            "urn:tollgate:problem:unauthorized",
            "Authentication required",
            detail,
        );
        p.www_authenticate = true;
        p
    }

    /// 403: a read-only token tried to write.
    pub fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "urn:tollgate:problem:forbidden",
            "Not allowed",
            detail,
        )
    }

    /// 404: an endpoint this port does not serve (as configured).
    pub fn not_served(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "urn:tollgate:problem:not-served",
            "Not served on this port",
            detail,
        )
    }

    /// 404.
    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "urn:tollgate:problem:not-found",
            "No such rule",
            detail,
        )
    }

    /// 409: the rule exists, but not where this write could change it (a rule from a file).
    pub fn conflict(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "urn:tollgate:problem:rule-from-file",
            "The rule comes from a file",
            detail,
        )
    }

    /// 412: `If-Match` names a version that is not the current one.
    pub fn stale(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::PRECONDITION_FAILED,
            "urn:tollgate:problem:version-conflict",
            "The rule has changed",
            detail,
        )
    }

    /// 413.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "urn:tollgate:problem:body-too-large",
            "The request body is too large",
            format!("request bodies are limited to {limit} bytes"),
        )
    }

    /// 503: the rule store is unreachable.
    pub fn unavailable(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "urn:tollgate:problem:store-unavailable",
            "The rule store is unavailable",
            detail,
        )
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_string(&self).unwrap_or_default();
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if let Some(allowed) = self.allow {
            headers.insert(header::ALLOW, HeaderValue::from_static(allowed));
        }
        if self.www_authenticate {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"tollgate-admin\""),
            );
        }
        response
    }
}
