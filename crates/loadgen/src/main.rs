//! `tollgate-loadgen`: drives any Envoy RLS v3 server (`envoy.service.ratelimit.v3`) with a
//! chosen key distribution and reports throughput, latency and answers; and `bare`, a tonic
//! server built from the same protos that answers OK to everything: the stack's own ceiling,
//! which every Tollgate figure is measured against.
//!
//! ```sh
//! tollgate-loadgen run --target http://127.0.0.1:8081 --keys zipf:1000000 --duration 10s
//! tollgate-loadgen bare --listen 127.0.0.1:9081 --runtime current
//! ```
//!
//! # Layout
//! - [`cli`]: the commands and their settings.
//! - [`keys`]: key distributions (one hot key, Zipf, uniform, always new).
//! - [`drive`]: the client: closed loop or fixed rate, over several connections.
//! - [`report`]: the table and the JSON.
//! - [`bare`]: the bare server.

/// The same allocator as the `tollgate` binary: the bare server is the ceiling of the same
/// stack, allocator included, and the client's share of a shared machine stays small.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod bare;
mod cli;
mod drive;
mod keys;
mod report;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    let outcome = match cli.command {
        cli::Command::Run(run) => drive::main(*run),
        cli::Command::Bare(bare) => bare::main(bare),
    };
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tollgate-loadgen: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
