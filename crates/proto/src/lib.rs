//! Protocol types for Tollgate's gRPC APIs, generated at build time by protox (no system
//! `protoc`).
//!
//! # Layout
//! - [`envoy`]: Envoy's rate limit service, v3 (`envoy.service.ratelimit.v3`), and its rate
//!   limit quota service (`envoy.service.rate_limit_quota.v3`, RLQS), wire-compatible.
//! - [`tollgate`]: Tollgate's own decision API (`tollgate.ratelimit.v1`) and the link between
//!   regions (`tollgate.regionsync.v1`).
//! - [`FILE_DESCRIPTOR_SET`]: every message and service, for gRPC reflection.
//! - [`coalesced`]: the TCP connection a gRPC server of these services writes through, so
//!   that small answers share a system call (the node's server and the bench's bare one).

#![allow(missing_docs, unreachable_pub, clippy::all)]

pub mod coalesced;

/// Envoy's protos (only what the rate limit services need).
pub mod envoy {
    pub mod service {
        pub mod ratelimit {
            pub mod v3 {
                tonic::include_proto!("envoy.service.ratelimit.v3");
            }
        }
        pub mod rate_limit_quota {
            pub mod v3 {
                tonic::include_proto!("envoy.service.rate_limit_quota.v3");
            }
        }
    }
    pub mod extensions {
        pub mod common {
            pub mod ratelimit {
                pub mod v3 {
                    tonic::include_proto!("envoy.extensions.common.ratelimit.v3");
                }
            }
        }
    }
    pub mod config {
        pub mod core {
            pub mod v3 {
                tonic::include_proto!("envoy.config.core.v3");
            }
        }
    }
    pub mod r#type {
        pub mod v3 {
            tonic::include_proto!("envoy.r#type.v3");
        }
    }
}

/// Tollgate's own APIs.
pub mod tollgate {
    pub mod ratelimit {
        pub mod v1 {
            tonic::include_proto!("tollgate.ratelimit.v1");
        }
    }
    pub mod regionsync {
        pub mod v1 {
            tonic::include_proto!("tollgate.regionsync.v1");
        }
    }
}

/// The encoded `FileDescriptorSet` of every proto here, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptors.bin"));
