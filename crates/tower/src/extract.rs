//! From an HTTP request to what the rules match: one descriptor of the attributes the
//! gateway trusts (an API key header, the subject and claims its auth layer verified, the
//! client's address, the method and route template) and the request's cost.
//!
//! Only what the gateway vouches for is used: the route is the router's template
//! (`/orders/{id}`), never the raw path, so an id or a query string does not make a new
//! counter; the client's address comes from the one forwarding header the gateway's proxies
//! write, only as far as they vouch for it (see [`ClientIp`]), so a client cannot pick its own.

use std::collections::BTreeMap;

use http::{HeaderMap, HeaderName, Request};

use crate::client_ip::ClientIp;

/// What the gateway's authentication layer verified, placed in the request's extensions
/// before the rate limit layer runs (a JWT's `sub` and claims, an mTLS identity...).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifiedIdentity {
    /// The subject: becomes the `user` descriptor entry.
    pub subject: String,
    /// Verified claims (`plan: gold`, `tenant: acme`): those the extractor names become
    /// entries under their own names.
    pub claims: BTreeMap<String, String>,
}

/// The route template of a request (`/orders/{id}`), for routers other than axum's (whose
/// `MatchedPath` is read directly).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteTemplate(pub String);

/// Where a request's cost comes from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Cost {
    /// Every request costs 1.
    #[default]
    One,
    /// A header holds the cost (a positive integer; absent: 1).
    Header(HeaderName),
    /// One unit per `bytes_per_unit` of the declared body (`Content-Length`, rounded up;
    /// at least 1).
    BodyBytes {
        /// Bytes one unit pays for.
        bytes_per_unit: u64,
    },
}

/// Why a request could not be turned into descriptors: the client's fault, answered 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExtractError {
    /// The cost header is not a positive integer.
    #[error("the {header} header must be a positive integer, got {value:?}")]
    BadCost {
        /// The header.
        header: String,
        /// What it held.
        value: String,
    },
    /// `Content-Length` is not a number.
    #[error("Content-Length must be a number to price the request by its size")]
    BadLength,
}

/// How requests become descriptors. Each part is opt-in.
///
/// ```
/// use tollgate_tower::{ClientIp, Extractor, ForwardedHeader};
///
/// let extractor = Extractor::new("public-api")
///     .api_key_header("x-api-key")
///     .subject()
///     .claim("plan")
///     .client_ip(ClientIp::behind_proxies(ForwardedHeader::XForwardedFor, ["10.0.0.0/8"]))
///     .route();
/// # let _ = extractor;
/// ```
#[derive(Debug, Clone)]
pub struct Extractor {
    domain: String,
    api_key: Option<HeaderName>,
    subject: bool,
    claims: Vec<String>,
    client_ip: Option<ClientIp>,
    route: bool,
    cost: Cost,
}

impl Extractor {
    /// Descriptors for the rules of `domain`.
    pub fn new(domain: impl Into<String>) -> Self {
        Self {
            domain: domain.into(),
            api_key: None,
            subject: false,
            claims: vec![],
            client_ip: None,
            route: false,
            cost: Cost::One,
        }
    }

    /// The domain.
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// `api_key` from this header.
    ///
    /// # Panics
    /// When `header` is not a valid header name (a programming error).
    pub fn api_key_header(mut self, header: &str) -> Self {
        self.api_key = Some(HeaderName::try_from(header).expect("a valid header name"));
        self
    }

    /// `user` from the [`VerifiedIdentity`]'s subject.
    pub fn subject(mut self) -> Self {
        self.subject = true;
        self
    }

    /// A verified claim, under its own name.
    pub fn claim(mut self, name: impl Into<String>) -> Self {
        self.claims.push(name.into());
        self
    }

    /// `ip`: the client's address, found as `client_ip` says (the one header the gateway's
    /// proxies write, believed only as far as they vouch for it), an IPv6 one as its prefix.
    pub fn client_ip(mut self, client_ip: ClientIp) -> Self {
        self.client_ip = Some(client_ip);
        self
    }

    /// `route`: the method and the route template (`POST /orders/{id}`).
    pub fn route(mut self) -> Self {
        self.route = true;
        self
    }

    /// Where the cost comes from.
    pub fn cost(mut self, cost: Cost) -> Self {
        self.cost = cost;
        self
    }

    /// The route template of `request` (`METHOD /template`), when the router told it.
    pub fn route_of<B>(request: &Request<B>) -> Option<String> {
        let template = request
            .extensions()
            .get::<axum::extract::MatchedPath>()
            .map(|m| m.as_str().to_owned())
            .or_else(|| {
                request
                    .extensions()
                    .get::<RouteTemplate>()
                    .map(|r| r.0.clone())
            })?;
        Some(format!("{} {template}", request.method()))
    }

    /// The request's descriptors and cost.
    pub fn extract<B>(&self, request: &Request<B>) -> Result<tollgate_node::Request, ExtractError> {
        let mut entries: Vec<(String, String)> = vec![];
        if let Some(header) = &self.api_key
            && let Some(key) = request.headers().get(header).and_then(|v| v.to_str().ok())
            && !key.is_empty()
        {
            entries.push(("api_key".into(), key.to_owned()));
        }
        if let Some(identity) = request.extensions().get::<VerifiedIdentity>() {
            if self.subject && !identity.subject.is_empty() {
                entries.push(("user".into(), identity.subject.clone()));
            }
            for claim in &self.claims {
                if let Some(value) = identity.claims.get(claim) {
                    entries.push((claim.clone(), value.clone()));
                }
            }
        }
        if let Some(client_ip) = &self.client_ip
            && let Some(ip) = client_ip.key_of(request)
        {
            entries.push(("ip".into(), ip));
        }
        if self.route
            && let Some(route) = Self::route_of(request)
        {
            entries.push(("route".into(), route));
        }
        let cost = self.cost_of(request.headers())?;
        Ok(tollgate_node::Request::new(self.domain.clone())
            .descriptor(entries)
            .cost(cost))
    }

    fn cost_of(&self, headers: &HeaderMap) -> Result<u64, ExtractError> {
        match &self.cost {
            Cost::One => Ok(1),
            Cost::Header(name) => match headers.get(name) {
                None => Ok(1),
                Some(value) => value
                    .to_str()
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .filter(|c| *c > 0)
                    .ok_or_else(|| ExtractError::BadCost {
                        header: name.to_string(),
                        value: String::from_utf8_lossy(value.as_bytes()).into_owned(),
                    }),
            },
            Cost::BodyBytes { bytes_per_unit } => {
                let length = match headers.get(http::header::CONTENT_LENGTH) {
                    None => 0,
                    Some(v) => v
                        .to_str()
                        .ok()
                        .and_then(|v| v.trim().parse::<u64>().ok())
                        .ok_or(ExtractError::BadLength)?,
                };
                Ok(length.div_ceil((*bytes_per_unit).max(1)).max(1))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client_ip::PeerAddr;

    fn request(peer: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut builder = Request::builder().uri("/orders/17?x=1");
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        let mut request = builder.body(()).expect("request");
        request
            .extensions_mut()
            .insert(PeerAddr(peer.parse().expect("peer")));
        request
    }

    #[test]
    fn costs_are_read_or_refused() {
        let e = Extractor::new("d").cost(Cost::Header(HeaderName::from_static("x-cost")));
        let cost =
            |headers: &[(&str, &str)]| e.extract(&request("10.1.1.1:1", headers)).map(|r| r.cost);
        assert_eq!(cost(&[]), Ok(1));
        assert_eq!(cost(&[("x-cost", "7")]), Ok(7));
        assert!(matches!(
            cost(&[("x-cost", "0")]),
            Err(ExtractError::BadCost { .. })
        ));
        assert!(matches!(
            cost(&[("x-cost", "lots")]),
            Err(ExtractError::BadCost { .. })
        ));
        let by_size = Extractor::new("d").cost(Cost::BodyBytes {
            bytes_per_unit: 1024,
        });
        let sized = |len: &str| {
            by_size
                .extract(&request("10.1.1.1:1", &[("content-length", len)]))
                .map(|r| r.cost)
        };
        assert_eq!(sized("3000"), Ok(3));
        assert_eq!(sized("0"), Ok(1));
        assert_eq!(sized("x"), Err(ExtractError::BadLength));
    }

    #[test]
    fn the_route_is_the_template_never_the_raw_path() {
        let e = Extractor::new("d").route();
        let mut r = request("10.1.1.1:1", &[]);
        assert!(e.extract(&r).expect("ok").descriptors[0].entries.is_empty());
        r.extensions_mut()
            .insert(RouteTemplate("/orders/{id}".into()));
        assert_eq!(
            e.extract(&r).expect("ok").descriptors[0].entries,
            vec![("route".to_owned(), "GET /orders/{id}".to_owned())]
        );
    }
}
