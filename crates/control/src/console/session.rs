//! Who is looking at the console: a person signs in with an admin token once and gets a
//! session, kept in this node's memory (32 random bytes, its token's name and access, a CSRF
//! token of its own, an expiry), named by an `HttpOnly; SameSite=Strict` cookie (`Secure` and
//! `__Host-` under TLS). Signing out or expiring forgets it; a restart forgets them all.

use std::collections::HashMap;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, header};
use parking_lot::Mutex;
use subtle::ConstantTimeEq;
use tokio::time::Instant;

use crate::auth::Access;

/// How long a session lasts from sign-in (a working day; then sign in again).
pub const SESSION_LIFETIME: Duration = Duration::from_secs(8 * 3600);

/// The most sessions kept at once: only a valid token makes one, but a script signing in in a
/// loop must not grow the node's memory. The oldest goes first.
pub const MAX_SESSIONS: usize = 10_000;

/// One signed-in person.
#[derive(Debug, Clone)]
pub struct Session {
    /// The token's name (what the history records as who did it).
    pub name: String,
    /// What the token may do.
    pub access: Access,
    /// The synchronizer token every form of this session carries.
    pub csrf: String,
    expires: Instant,
}

impl Session {
    /// Whether this session may change anything.
    pub fn may_act(&self) -> bool {
        self.access == Access::Write
    }

    /// Whether `presented` is this session's CSRF token (compared in constant time).
    pub fn csrf_matches(&self, presented: &str) -> bool {
        !presented.is_empty() && bool::from(presented.as_bytes().ct_eq(self.csrf.as_bytes()))
    }
}

/// The sessions of this node's console.
#[derive(Debug)]
pub struct Sessions {
    by_id: Mutex<HashMap<String, Session>>,
    /// Whether the console is served over TLS (the cookie is then `Secure` and `__Host-`).
    secure: bool,
}

fn random_hex() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Sessions {
    /// No one signed in yet.
    pub fn new(secure: bool) -> Self {
        Self {
            by_id: Mutex::new(HashMap::new()),
            secure,
        }
    }

    /// The cookie's name: `__Host-` prefixed under TLS (bound to this host, path `/`, Secure).
    pub fn cookie_name(&self) -> &'static str {
        if self.secure {
            "__Host-tollgate-console"
        } else {
            "tollgate-console"
        }
    }

    /// Starts a session for the token `name` with `access`: the session, the `Set-Cookie`
    /// value to send, and its id.
    pub fn start(&self, name: String, access: Access) -> (Session, HeaderValue, String) {
        let id = random_hex();
        let now = Instant::now();
        let session = Session {
            name,
            access,
            csrf: random_hex(),
            expires: now + SESSION_LIFETIME,
        };
        let mut sessions = self.by_id.lock();
        sessions.retain(|_, s| s.expires > now);
        if sessions.len() >= MAX_SESSIONS
            && let Some(oldest) = sessions
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(id, _)| id.clone())
        {
            sessions.remove(&oldest);
        }
        sessions.insert(id.clone(), session.clone());
        drop(sessions);
        let cookie = self.cookie(&id, SESSION_LIFETIME.as_secs());
        (session, cookie, id)
    }

    /// The live session the request's cookie names, with its id.
    pub fn of(&self, headers: &HeaderMap) -> Option<(String, Session)> {
        let id = self.cookie_value(headers)?;
        let mut sessions = self.by_id.lock();
        match sessions.get(id) {
            Some(s) if s.expires > Instant::now() => Some((id.to_owned(), s.clone())),
            Some(_) => {
                sessions.remove(id);
                None
            }
            None => None,
        }
    }

    /// Forgets the session `id`; the `Set-Cookie` value that clears the cookie.
    pub fn end(&self, id: &str) -> HeaderValue {
        self.by_id.lock().remove(id);
        self.cookie("", 0)
    }

    fn cookie_value<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str> {
        let name = self.cookie_name();
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v)
    }

    fn cookie(&self, value: &str, max_age: u64) -> HeaderValue {
        let secure = if self.secure { "; Secure" } else { "" };
        HeaderValue::from_str(&format!(
            "{}={value}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Strict{secure}",
            self.cookie_name()
        ))
        .unwrap_or_else(|_| HeaderValue::from_static(""))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_cookie(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_str(value).expect("header"),
        );
        headers
    }

    /// A session is found by its cookie among others, not by a guess or an ended one; its CSRF
    /// token matches only itself (an empty one never); under TLS the cookie is `__Host-`
    /// and `Secure`.
    #[tokio::test]
    async fn a_session_is_its_cookie_until_it_ends() {
        let sessions = Sessions::new(false);
        let (session, cookie, _) = sessions.start("alice".into(), Access::Write);
        let cookie = cookie.to_str().expect("ascii").to_owned();
        assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"));
        assert!(!cookie.contains("Secure"), "{cookie}");
        let id = cookie
            .split(';')
            .next()
            .and_then(|p| p.split_once('='))
            .map(|(_, v)| v.to_owned())
            .expect("value");
        assert_eq!(id.len(), 64);
        let found = sessions
            .of(&with_cookie(&format!("theme=dark; tollgate-console={id}")))
            .expect("found");
        assert_eq!(found.1.name, "alice");
        assert!(found.1.csrf_matches(&session.csrf));
        assert!(!found.1.csrf_matches(""));
        assert!(!found.1.csrf_matches(&session.csrf[1..]));
        assert!(
            sessions
                .of(&with_cookie(&format!("tollgate-console={}", &id[1..])))
                .is_none()
        );
        sessions.end(&id);
        assert!(
            sessions
                .of(&with_cookie(&format!("tollgate-console={id}")))
                .is_none()
        );
        let secure = Sessions::new(true);
        let (_, cookie, _) = secure.start("bob".into(), Access::Read);
        let cookie = cookie.to_str().expect("ascii");
        assert!(cookie.starts_with("__Host-tollgate-console=") && cookie.ends_with("; Secure"));
    }

    /// A session lasts its lifetime, then is gone.
    #[tokio::test(start_paused = true)]
    async fn a_session_expires() {
        let sessions = Sessions::new(false);
        let (_, cookie, _) = sessions.start("alice".into(), Access::Read);
        let pair = cookie
            .to_str()
            .expect("ascii")
            .split(';')
            .next()
            .expect("pair")
            .to_owned();
        assert!(sessions.of(&with_cookie(&pair)).is_some());
        tokio::time::advance(SESSION_LIFETIME + Duration::from_secs(1)).await;
        assert!(sessions.of(&with_cookie(&pair)).is_none());
    }
}
