//! The in-memory store's leases: grants taken from a bucket (and its region's allowance), and
//! unspent units given back.

use std::time::Duration;

use super::*;

impl MemoryStore {
    pub(super) fn acquire_leases_now(
        &self,
        req: &LeaseRequest,
    ) -> Result<Vec<LeaseGrant>, StoreError> {
        let asks = req.asks();
        let ttl_us = req.ttl().as_micros() as u64;
        let nonce = self.nonce();
        let names: Vec<String> = asks
            .iter()
            .flat_map(|a| [state_key(&a.key, &a.limit).into_owned(), a.key.lease_key()])
            .collect();
        let extra = allowance_keys(asks.iter().map(|a| (&a.key, a.allowance.as_ref())));
        let creates: Vec<&str> = names
            .iter()
            .chain(extra.iter())
            .map(String::as_str)
            .collect();
        self.with_shard(&asks[0].key, &creates, |keys, now| {
            asks.iter()
                .enumerate()
                .map(|(position, ask)| {
                    let (allowance, penalized) = (&ask.allowance, &ask.penalized);
                    let lease_key = ask.key.lease_key();
                    let mut leases = keys.take_sorted(&lease_key, now);
                    leases.remove_up_to(now);
                    let k = state_key(&ask.key, &ask.limit);
                    let mut b = Bucket::load(keys, &k, &ask.limit, now);
                    let mut allowance = allowance
                        .as_ref()
                        .map(|a| Allowed::load(keys, &ask.key, &ask.limit, a, now));
                    let view_available = b.available(&ask.limit, now);
                    let available = match &allowance {
                        Some(a) => view_available.min(a.bucket.available(&a.limit, now)),
                        None => view_available,
                    };
                    let block = if *penalized {
                        block_left(keys, &ask.key, now)
                    } else {
                        0
                    };
                    let grant = if block > 0 {
                        0
                    } else {
                        grant_size(available, ask.want, ask.min, ask.max_share)
                    };
                    if grant == 0 {
                        let live_leases = leases.len() as u64;
                        store_leases(keys, &lease_key, leases, now);
                        let mut retry = if view_available < ask.min {
                            b.retry_after(&ask.limit, now, ask.min)
                        } else {
                            0
                        };
                        let mut reset = b.reset_after(&ask.limit, now);
                        if let Some(a) = &allowance {
                            if a.bucket.available(&a.limit, now) < ask.min {
                                retry = retry.max(a.bucket.retry_after(&a.limit, now, ask.min));
                            }
                            reset = reset.max(a.bucket.reset_after(&a.limit, now));
                        }
                        let refusal = LeaseGrant {
                            units: 0,
                            lease: None,
                            valid_for: Duration::ZERO,
                            remaining: available,
                            retry_after: us(retry.max(block)),
                            reset_after: us(reset),
                            live_leases,
                            blocked_for: us(block),
                        };
                        b.restore(keys, &k);
                        if let Some(a) = allowance {
                            a.store(keys, false, now);
                        }
                        return refusal;
                    }
                    let entry = b.consume(&ask.limit, now, grant, "");
                    let (valid_for, ws) = lease_validity(&ask.limit, &b, now, ttl_us);
                    let mut code = ask.limit.algorithm().script_code();
                    let (mut remaining, mut reset) =
                        (b.available(&ask.limit, now), b.reset_after(&ask.limit, now));
                    if let Some(a) = allowance.as_mut() {
                        a.bucket.consume(&a.limit, now, grant, "");
                        code += ALLOWANCE_CODE;
                        remaining = remaining.min(a.bucket.available(&a.limit, now));
                        reset = reset.max(a.bucket.reset_after(&a.limit, now));
                    }
                    if let Some(a) = allowance {
                        a.store(keys, true, now);
                    }
                    let tail = format!(":{ws}:{code}:{nonce}");
                    let id = match entry {
                        // The log's lease is named after its entry (`<id>:<units>`); other
                        // leases after the time and the ask's position (the nonce tells
                        // requests apart).
                        Some(member) => member,
                        None => format!("{now}.{}:{grant}", position + 1),
                    };
                    let lease = format!("{id}{tail}");
                    leases.add(now + valid_for, lease.clone());
                    let live_leases = leases.len() as u64;
                    let out = LeaseGrant {
                        units: grant,
                        lease: Some(LeaseId(lease.into())),
                        valid_for: us(valid_for),
                        remaining,
                        retry_after: Duration::ZERO,
                        reset_after: us(reset),
                        live_leases,
                        blocked_for: Duration::ZERO,
                    };
                    b.store(keys, &k, &ask.limit, now);
                    store_leases(keys, &lease_key, leases, now);
                    out
                })
                .collect()
        })
    }

    pub(super) fn return_leases_now(&self, req: &ReturnRequest) -> Result<Vec<u64>, StoreError> {
        let items = req.items();
        self.with_shard(&items[0].key, &[], |keys, now| {
            items
                .iter()
                .map(|item| {
                    let allowance = &item.allowance;
                    let lease_key = item.key.lease_key();
                    let mut leases = keys.take_sorted(&lease_key, now);
                    let Some(expiry) = leases.score(item.lease.as_str()) else {
                        keys.restore_sorted(&lease_key, leases);
                        return 0;
                    };
                    leases.remove(item.lease.as_str());
                    store_leases(keys, &lease_key, leases, now);
                    let Some(lease) = ParsedLease::parse(item.lease.as_str()) else {
                        return 0;
                    };
                    let code = item.limit.algorithm().script_code();
                    if expiry <= now || lease.algorithm % ALLOWANCE_CODE != code {
                        return 0;
                    }
                    let credit = item.unspent.min(lease.units);
                    // A lease taken under an allowance gives its units back to it too (at the
                    // share in force now; the used tokens are what carries over).
                    if let Some(a) = allowance
                        .as_ref()
                        .filter(|_| lease.algorithm > ALLOWANCE_CODE)
                    {
                        let mut allowed = Allowed::load(keys, &item.key, &item.limit, a, now);
                        let back =
                            credit_bucket(&mut allowed.bucket, &allowed.limit, credit, lease.ws);
                        allowed.store(keys, back > 0, now);
                    }
                    let k = state_key(&item.key, &item.limit);
                    let mut b = Bucket::load(keys, &k, &item.limit, now);
                    let credited = match &mut b {
                        Bucket::TokenBucket(_)
                        | Bucket::Gcra(_)
                        | Bucket::LeakyBucket(_)
                        | Bucket::FixedWindow(_)
                        | Bucket::SlidingWindow(_) => {
                            credit_bucket(&mut b, &item.limit, credit, lease.ws)
                        }
                        Bucket::Log(log) => match log.remove(&lease.entry) {
                            Some((score, units)) => {
                                let c = credit.min(units);
                                if units > c {
                                    log.entries
                                        .add(score, format!("{}:{}", lease.id, units - c));
                                    log.used += units - c;
                                }
                                c
                            }
                            None => 0,
                        },
                        _ => 0,
                    };
                    if credited > 0 {
                        b.store(keys, &k, &item.limit, now);
                    } else {
                        b.restore(keys, &k);
                    }
                    credited
                })
                .collect()
        })
    }
}
