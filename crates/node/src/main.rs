//! `tollgate`: runs one node. See `tollgate --help`.

use clap::Parser;
use tollgate_node::app::App;
use tollgate_node::config::Cli;

fn main() -> std::process::ExitCode {
    let config = match Cli::parse().resolve() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("tollgate: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    init_logging(config.log_json);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tollgate: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        match App::start(config).await {
            Ok(app) => {
                app.run(shutdown_signal()).await;
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                tracing::error!("cannot start: {e}");
                eprintln!("tollgate: {e}");
                std::process::ExitCode::from(2)
            }
        }
    })
}

fn init_logging(json: bool) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
