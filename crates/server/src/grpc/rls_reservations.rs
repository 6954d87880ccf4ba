//! Reserve, then settle, through Envoy's rate limit service ([docs/reserve-settle.md],
//! "Through Envoy"). Envoy calls RLS at the request's headers and, for the `rate_limits`
//! entries marked `apply_on_stream_done`, once more when the stream ends (and ignores that
//! answer). A request names which of the two it is with one descriptor of its own, beside the
//! descriptors the rules match:
//!
//! - `[tollgate.reserve = <request id>]`, optionally followed by `[ttl_ms = N]`: the other
//!   descriptors are reserved at their `hits_addend` (the estimate), as
//!   `CheckRateLimit(reserve_ttl_ms)` does, under an id made from the request id
//!   ([`reservation_id_for`]); the answer is the decision, as for any request.
//! - `[tollgate.settle = <request id>]`: each other descriptor settles that reservation at its
//!   own `hits_addend` (the actual cost); nothing is decided, and the answer is OK.
//!
//! Envoy sends the request id from `x-request-id` (a `request_headers` action), which its
//! connection manager sets on every request at the edge. An entry whose `hits_addend` format
//! has no value (the response carried no cost) is not sent by Envoy, so its reservation
//! stays charged at the estimate: the safe side.
//!
//! [docs/reserve-settle.md]: https://example.invalid/tollgate/docs/reserve-settle.md

use std::time::Duration;

use tollgate_node::runtime::node::reservations::{new_id, reservation_id_for};
use tollgate_proto::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::Status;

/// The descriptor key that makes a request a reservation; its value is the request's id.
pub const RESERVE_KEY: &str = "tollgate.reserve";
/// The descriptor key that makes a request a settlement; its value is the request's id.
pub const SETTLE_KEY: &str = "tollgate.settle";
/// The reserve descriptor's optional second entry: the reservation's time to live, in ms.
pub const TTL_KEY: &str = "ttl_ms";
/// A reservation's time to live when its descriptor names none: longer than most streamed
/// responses. What an unsettled reservation costs is its estimate, whenever it expires.
pub const DEFAULT_TTL: Duration = Duration::from_secs(300);

/// What a request's own descriptor asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Marker {
    /// Reserve the other descriptors' cost under `id` for `ttl`.
    Reserve {
        /// The reservation id ([`reservation_id_for`] the request id).
        id: String,
        /// How long the reservation lives unsettled.
        ttl: Duration,
    },
    /// Settle the reservation `id` at the other descriptors' cost.
    Settle {
        /// The reservation id ([`reservation_id_for`] the request id).
        id: String,
    },
}

/// Takes the reserve or settle descriptor out of `request`, if it has one: the marker and
/// where it stood among the descriptors (the answer keeps one status per descriptor sent).
/// A request with two, or with one that is not well formed, is refused naming the field.
pub fn take_marker(
    request: &mut RateLimitRequest,
    default_ttl: Duration,
) -> Result<Option<(usize, Marker)>, Status> {
    let is_marker =
        |d: &tollgate_proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor| {
            d.entries
                .first()
                .is_some_and(|e| e.key == RESERVE_KEY || e.key == SETTLE_KEY)
        };
    let mut found = request
        .descriptors
        .iter()
        .enumerate()
        .filter(|(_, d)| is_marker(d));
    let Some((at, _)) = found.next() else {
        return Ok(None);
    };
    if let Some((second, _)) = found.next() {
        return Err(Status::invalid_argument(format!(
            "descriptors[{second}]: a second {RESERVE_KEY} or {SETTLE_KEY} descriptor (descriptors[{at}] is one)"
        )));
    }
    let d = request.descriptors.remove(at);
    let field = |what: &str| format!("descriptors[{at}].entries{what}");
    let first = &d.entries[0];
    // The request id is a header a client may send (where Envoy does not set it at the edge):
    // an empty one names no request, so it gets an id of its own that nothing will settle.
    // The request is reserved at its estimate as any other, and stays charged at it: the
    // safe side, and no RPC error (an uncounted allow behind Envoy's default).
    let id = if first.value.is_empty() {
        new_id()
    } else {
        reservation_id_for(&first.value)
    };
    let marker = if first.key == SETTLE_KEY {
        if d.entries.len() > 1 {
            return Err(Status::invalid_argument(format!(
                "{}: {SETTLE_KEY} takes no other entry",
                field("[1]")
            )));
        }
        Marker::Settle { id }
    } else {
        let ttl = match &d.entries[1..] {
            [] => default_ttl,
            [e] if e.key == TTL_KEY => {
                let max = tollgate_lease::MAX_RESERVATION_TTL.as_millis() as u64;
                match std::str::from_utf8(&e.value).map(str::parse::<u64>) {
                    Ok(Ok(ms)) if (1..=max).contains(&ms) => Duration::from_millis(ms),
                    _ => {
                        return Err(Status::invalid_argument(format!(
                            "{}: {TTL_KEY} is 1 to {max} (milliseconds), not {:?}",
                            field("[1].value"),
                            String::from_utf8_lossy(&e.value)
                        )));
                    }
                }
            }
            _ => {
                return Err(Status::invalid_argument(format!(
                    "{}: {RESERVE_KEY} takes one more entry at most, {TTL_KEY}",
                    field("[1]")
                )));
            }
        };
        Marker::Reserve { id, ttl }
    };
    Ok(Some((at, marker)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use tollgate_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;

    fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(k, v)| Entry {
                    key: (*k).into(),
                    value: (*v).into(),
                })
                .collect(),
            ..RateLimitDescriptor::default()
        }
    }

    fn request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
        RateLimitRequest {
            domain: "d".into(),
            descriptors,
            hits_addend: 0,
        }
    }

    const TTL: Duration = Duration::from_secs(300);

    #[test]
    fn a_marker_is_taken_out_where_it_stood() {
        let mut r = request(vec![
            descriptor(&[("api_key", "k")]),
            descriptor(&[(RESERVE_KEY, "rid-1"), (TTL_KEY, "2500")]),
            descriptor(&[("route", "r")]),
        ]);
        let (at, marker) = take_marker(&mut r, TTL).expect("ok").expect("marker");
        assert_eq!(at, 1);
        assert_eq!(
            marker,
            Marker::Reserve {
                id: reservation_id_for("rid-1"),
                ttl: Duration::from_millis(2500)
            }
        );
        assert_eq!(r.descriptors.len(), 2);
        assert_eq!(r.descriptors[1].entries[0].key, "route");

        let mut r = request(vec![descriptor(&[(SETTLE_KEY, "rid-1")])]);
        let (_, marker) = take_marker(&mut r, TTL).expect("ok").expect("marker");
        assert_eq!(
            marker,
            Marker::Settle {
                id: reservation_id_for("rid-1")
            }
        );
        let mut plain = request(vec![descriptor(&[("api_key", "k")])]);
        assert_eq!(take_marker(&mut plain, TTL).expect("ok"), None);
        assert_eq!(plain.descriptors.len(), 1);
    }

    #[test]
    fn a_reserve_without_a_ttl_takes_the_default() {
        let mut r = request(vec![descriptor(&[(RESERVE_KEY, "x")])]);
        let (_, marker) = take_marker(&mut r, TTL).expect("ok").expect("marker");
        assert_eq!(
            marker,
            Marker::Reserve {
                id: reservation_id_for("x"),
                ttl: TTL
            }
        );
    }

    #[test]
    fn bad_markers_are_refused_naming_the_field() {
        let cases: Vec<(Vec<RateLimitDescriptor>, &str)> = vec![
            (
                vec![
                    descriptor(&[(RESERVE_KEY, "a")]),
                    descriptor(&[(SETTLE_KEY, "a")]),
                ],
                "descriptors[1]",
            ),
            (
                vec![descriptor(&[(RESERVE_KEY, "a"), (TTL_KEY, "0")])],
                "descriptors[0].entries[1].value",
            ),
            (
                vec![descriptor(&[(RESERVE_KEY, "a"), (TTL_KEY, "soon")])],
                "descriptors[0].entries[1].value",
            ),
            (
                vec![descriptor(&[(RESERVE_KEY, "a"), ("api_key", "k")])],
                "descriptors[0].entries[1]",
            ),
            (
                vec![descriptor(&[(SETTLE_KEY, "a"), (TTL_KEY, "5")])],
                "descriptors[0].entries[1]",
            ),
        ];
        for (descriptors, field) in cases {
            let mut r = request(descriptors);
            let e = take_marker(&mut r, TTL).expect_err("refused");
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().starts_with(field), "{field}: {}", e.message());
        }
    }

    #[test]
    fn an_empty_request_id_is_a_reservation_of_its_own_that_nothing_settles() {
        let ids: Vec<Marker> = (0..2)
            .map(|_| {
                let mut r = request(vec![descriptor(&[(RESERVE_KEY, "")])]);
                take_marker(&mut r, TTL).expect("read").expect("marker").1
            })
            .collect();
        let [Marker::Reserve { id: a, .. }, Marker::Reserve { id: b, .. }] = &ids[..] else {
            panic!("reservations: {ids:?}");
        };
        assert_ne!(a, b, "two requests with no id share no reservation");
        assert_ne!(
            a,
            &reservation_id_for(""),
            "a settle with no id names neither"
        );
    }

    #[test]
    fn the_id_is_the_same_for_the_same_request_id_and_well_formed_for_any() {
        assert_eq!(reservation_id_for("a b/c"), reservation_id_for("a b/c"));
        assert_ne!(reservation_id_for("a"), reservation_id_for("b"));
        let id = reservation_id_for("\u{e9}\0 any string");
        assert_eq!(id.len(), 32);
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
    }
}
