//! Peer liveness: Up until no call to the peer (heartbeat or batch) has succeeded for
//! `failover_after`; then Down. Back Up only after `failback_after` of uninterrupted success,
//! so a link that flaps does not flip the shares back and forth.
//!
//! A node starts with the peer Up as far as shares go (the cautious split: never the whole
//! limit before the peer is known to be gone) but not yet *reached*: it reports the peer as
//! reachable only once a call has succeeded.

use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;
use tollgate_lease::Micros;

use crate::policy::PeerState;

/// The failure detector's settings.
#[derive(Debug, Clone, Copy)]
pub struct Liveness {
    /// Unreachable this long: Down.
    pub failover_after: Duration,
    /// Reachable without a failure this long: Up again.
    pub failback_after: Duration,
}

#[derive(Debug)]
struct Inner {
    state: PeerState,
    /// A call to the peer has succeeded at least once.
    reached: bool,
    last_success: Micros,
    /// Since when every call has succeeded (None after a failure).
    streak_since: Option<Micros>,
    changed_at: Micros,
}

/// The peer's state as this node sees it.
#[derive(Debug)]
pub struct PeerTracker {
    liveness: Liveness,
    inner: Mutex<Inner>,
    tx: watch::Sender<PeerState>,
}

impl PeerTracker {
    /// Starts Up at `now` (a peer that never answers goes Down after `failover_after`).
    pub fn new(liveness: Liveness, now: Micros) -> Self {
        Self {
            liveness,
            inner: Mutex::new(Inner {
                state: PeerState::Up,
                reached: false,
                last_success: now,
                streak_since: Some(now),
                changed_at: now,
            }),
            tx: watch::Sender::new(PeerState::Up),
        }
    }

    /// The current state.
    pub fn state(&self) -> PeerState {
        self.inner.lock().state
    }

    /// Whether the peer has ever answered (until it has, it is not reported up).
    pub fn reached(&self) -> bool {
        self.inner.lock().reached
    }

    /// Changes of state, as they happen (and the first contact).
    pub fn subscribe(&self) -> watch::Receiver<PeerState> {
        self.tx.subscribe()
    }

    /// Microseconds since the last successful call, and since the last change of state.
    pub fn ages(&self, now: Micros) -> (u64, u64) {
        let inner = self.inner.lock();
        (
            now.saturating_sub(inner.last_success),
            now.saturating_sub(inner.changed_at),
        )
    }

    /// A call to the peer succeeded.
    pub fn success(&self, now: Micros) {
        let mut inner = self.inner.lock();
        inner.last_success = inner.last_success.max(now);
        if !inner.reached {
            inner.reached = true;
            tracing::info!("peer region reached");
            self.tx.send_replace(inner.state);
        }
        let since = *inner.streak_since.get_or_insert(now);
        if inner.state == PeerState::Down
            && now.saturating_sub(since) >= self.liveness.failback_after.as_micros() as u64
        {
            self.change(&mut inner, PeerState::Up, now);
        }
    }

    /// A call to the peer failed.
    pub fn failure(&self, now: Micros) {
        let mut inner = self.inner.lock();
        inner.streak_since = None;
        self.check(&mut inner, now);
    }

    /// Re-evaluates with no news (time alone can make the peer Down).
    pub fn tick(&self, now: Micros) {
        let mut inner = self.inner.lock();
        self.check(&mut inner, now);
    }

    fn check(&self, inner: &mut Inner, now: Micros) {
        if inner.state == PeerState::Up
            && now.saturating_sub(inner.last_success)
                >= self.liveness.failover_after.as_micros() as u64
        {
            self.change(inner, PeerState::Down, now);
        }
    }

    fn change(&self, inner: &mut Inner, state: PeerState, now: Micros) {
        inner.state = state;
        inner.changed_at = now;
        tracing::warn!(?state, "peer region changed state");
        self.tx.send_replace(state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    #[test]
    fn the_peer_is_reached_only_once_it_has_answered() {
        let liveness = Liveness {
            failover_after: Duration::from_secs(10),
            failback_after: Duration::from_secs(5),
        };
        let peer = PeerTracker::new(liveness, 0);
        assert!(!peer.reached());
        peer.failure(5 * S);
        assert!(!peer.reached());
        peer.success(6 * S);
        assert!(peer.reached());
        let never = PeerTracker::new(liveness, 0);
        never.tick(10 * S);
        assert_eq!(
            never.state(),
            PeerState::Down,
            "never answering: down after the failover"
        );
        assert!(!never.reached());
    }

    #[test]
    fn down_after_silence_and_up_after_a_steady_streak() {
        let peer = PeerTracker::new(
            Liveness {
                failover_after: Duration::from_secs(10),
                failback_after: Duration::from_secs(5),
            },
            0,
        );
        peer.failure(9 * S);
        assert_eq!(peer.state(), PeerState::Up, "not silent long enough");
        peer.failure(10 * S);
        assert_eq!(peer.state(), PeerState::Down);
        // Flapping: successes interrupted by failures never reach the streak.
        for t in 11..=30 {
            if t % 3 == 0 {
                peer.failure(t * S);
            } else {
                peer.success(t * S);
            }
            assert_eq!(peer.state(), PeerState::Down, "at {t}s");
        }
        // The last failure was at 30 s: a streak from 31 s reaches 5 s at 36 s.
        peer.success(31 * S);
        peer.success(35 * S);
        assert_eq!(peer.state(), PeerState::Down);
        peer.success(36 * S);
        assert_eq!(peer.state(), PeerState::Up);
        assert_eq!(*peer.subscribe().borrow(), PeerState::Up);
        peer.tick(45 * S);
        assert_eq!(peer.state(), PeerState::Up);
        peer.tick(46 * S);
        assert_eq!(peer.state(), PeerState::Down);
    }
}
