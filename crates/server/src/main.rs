//! `tollgate`: runs one node. See `tollgate --help`.

use clap::Parser;
use std::time::Duration;
use tollgate_server::app::App;

use tollgate_control::RuleStore;
use tollgate_control::transfer;
use tollgate_server::config::{Cli, Command, RulesCommand};

/// mimalloc: the decision path allocates small, short-lived values on every worker (requests,
/// store commands and replies); glibc's allocator spent about 30 % of the node's CPU on them
/// with a million keys on Redis (perf), most of it in its arena locks and consolidation.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Gives freed memory back to the OS. mimalloc keeps the pages a thread freed for that thread
/// to reuse, and purges them only as the thread allocates again: after a flood of keys the
/// node's RSS stayed at 0.85 GB with every key actor gone. So a worker thread about to park
/// (it has no work) asks mimalloc to collect its pages and purge what is free, at most once a
/// second.
#[allow(unsafe_code)] // The one call into C: the allocator's collect (the workspace denies unsafe).
fn return_freed_memory(builder: &mut tokio::runtime::Builder) {
    use std::cell::Cell;
    builder.on_thread_park(|| {
        thread_local! {
            static LAST: Cell<Option<tokio::time::Instant>> = const { Cell::new(None) };
        }
        let now = tokio::time::Instant::now();
        if LAST
            .get()
            .is_some_and(|last| now - last < Duration::from_secs(1))
        {
            return;
        }
        LAST.set(Some(now));
        // SAFETY: mi_collect may be called from any thread at any time.
        unsafe { libmimalloc_sys::mi_collect(true) };
    });
}

fn main() -> std::process::ExitCode {
    let mut cli = Cli::parse();
    if let Some(command) = cli.command.take() {
        init_logging(false);
        return run_command(command);
    }
    let config = match cli.resolve() {
        Ok(config) => config,
        Err(errors) => {
            for e in &errors.0 {
                eprintln!("tollgate: {e}");
            }
            if errors.0.len() > 1 {
                eprintln!("tollgate: {} invalid settings", errors.0.len());
            }
            return std::process::ExitCode::from(2);
        }
    };
    // One thread per CPU the process may use. On one CPU a single-threaded runtime: worker
    // threads sharing one core cost more in wake-ups and work stealing than they add.
    let mut builder = if config.worker_threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(config.worker_threads);
        b
    };
    return_freed_memory(&mut builder);
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tollgate: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let json = config.log_json;
    // Logs, and traces when configured: the exporter runs on the runtime.
    let telemetry = {
        let _inside = runtime.enter();
        match tollgate_server::telemetry::init(json, config.traces.as_ref()) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("tollgate: {e}");
                return std::process::ExitCode::from(2);
            }
        }
    };
    runtime.block_on(async {
        let code = match App::start(config).await {
            Ok(app) => {
                app.run(shutdown_signal()).await;
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                // Said once: as a log record when logs are JSON (collectors read them), else
                // as one plain line.
                if json {
                    tracing::error!(error = %e, "cannot start");
                } else {
                    eprintln!("tollgate: cannot start: {e}");
                }
                std::process::ExitCode::from(2)
            }
        };
        // The spans still buffered go out before the process ends (the exporter needs the
        // runtime, so it is flushed from a blocking thread while the runtime runs).
        let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
        code
    })
}

/// `tollgate rules validate|import|export` and `tollgate check`.
fn run_command(command: Command) -> std::process::ExitCode {
    let action = match command {
        Command::Rules { action } => action,
        Command::Check(args) => return check(&args),
    };
    if let RulesCommand::Validate { files, strict } = &action {
        return match validate(files, *strict) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("tollgate: {e}");
                std::process::ExitCode::from(2)
            }
        };
    }
    let Some(runtime) = command_runtime() else {
        return std::process::ExitCode::FAILURE;
    };
    let result = runtime.block_on(async {
        let open = |url: &str| RuleStore::new(url, Duration::from_secs(5));
        match action {
            RulesCommand::Import {
                database_url,
                actor,
                prune,
                default_domain,
                files,
            } => {
                let store = open(&database_url)?;
                let s = transfer::import(&store, &files, &actor, prune, &default_domain).await?;
                println!(
                    "imported {} rules and {} envoyproxy/ratelimit domains ({} changed); pruned {}",
                    s.rules, s.envoy_domains, s.changed, s.pruned
                );
                for (id, before, after) in &s.modes_changed {
                    println!("rule {id}: mode {before} -> {after} (as its file says)");
                }
                for (id, held, file) in &s.held_by_override {
                    println!(
                        "rule {id}: a mode override holds it {held} (the file says {file}); \
                         the override stands until lifted: DELETE /admin/v1/mode-overrides/{id}"
                    );
                }
                for file in &s.override_files {
                    println!(
                        "{}: mode overrides, not imported (set them with PUT \
                         /admin/v1/mode-overrides/ID, or give the file to the nodes with --rules)",
                        file.display()
                    );
                }
                Ok::<(), transfer::TransferError>(())
            }
            RulesCommand::Validate { .. } => unreachable!("validated above, without a runtime"),
            RulesCommand::Export { database_url, out } => {
                let store = open(&database_url)?;
                let s = transfer::export(&store, &out).await?;
                println!(
                    "exported {} rules and {} envoyproxy/ratelimit domains to {}",
                    s.rules,
                    s.envoy_domains,
                    out.display()
                );
                Ok(())
            }
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tollgate: {e}");
            std::process::ExitCode::from(2)
        }
    }
}

/// The runtime a subcommand runs on (one thread), or None when it cannot start (said).
fn command_runtime() -> Option<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| eprintln!("tollgate: cannot start the async runtime: {e}"))
        .ok()
}

/// `tollgate check`: 0 admitted, 1 over the limit, 2 not asked.
fn check(args: &tollgate_server::check_client::CheckArgs) -> std::process::ExitCode {
    use tollgate_server::check_client::{ask, render};
    let Some(runtime) = command_runtime() else {
        return std::process::ExitCode::from(2);
    };
    let answer = match args.request().and_then(|_| runtime.block_on(ask(args))) {
        Ok(answer) => answer,
        Err(e) => {
            eprintln!("tollgate: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    if args.json {
        println!("{:#}", tollgate_server::json_check::to_json(&answer));
    } else if let Ok(request) = args.request() {
        print!("{}", render(&request, &answer));
    }
    let over = answer.overall_code
        == tollgate_proto::envoy::service::ratelimit::v3::rate_limit_response::Code::OverLimit
            as i32;
    std::process::ExitCode::from(u8::from(over))
}

/// `tollgate rules validate`: every error of every file (a file with three bad rules names
/// all three), then what the files hold together (a rule id defined twice across files).
fn validate(files: &[std::path::PathBuf], strict: bool) -> Result<(), String> {
    let checked = tollgate_node::rules::source::check(files);
    let mut errors: Vec<String> = checked.errors.iter().map(ToString::to_string).collect();
    let mut loaded = checked.loaded.clone();
    let applied = match tollgate_node::rules::overrides::apply(
        &mut loaded.native,
        &mut loaded.envoy,
        &loaded.overrides,
    ) {
        Ok(applied) => applied,
        Err(message) => {
            errors.push(message.to_string());
            vec![]
        }
    };
    if errors.is_empty()
        && let Err(message) = tollgate_node::rules::RuleSet::compile(
            &loaded.native,
            &loaded.envoy,
            1,
            &tollgate_node::metrics::Metrics::new(),
        )
    {
        errors.push(message.to_string());
    }
    let mut notes: Vec<String> = checked
        .empty
        .iter()
        .map(|f| format!("{}: empty: no rules in it", f.display()))
        .collect();
    notes.extend(applied.iter().filter(|o| o.rule_mode.is_none()).map(|o| {
        format!(
            "{}: a mode override of {:?}, which no rule here has",
            o.by.origin, o.by.id
        )
    }));
    notes.extend(checked.skipped.iter().map(|d| {
        format!(
            "{}: a subfolder, not read (rules are the directory's own files)",
            d.display()
        )
    }));
    for line in errors.iter().chain(&notes) {
        eprintln!("tollgate: {line}");
    }
    if !errors.is_empty() {
        return Err(format!(
            "{} error{} found",
            errors.len(),
            if errors.len() == 1 { "" } else { "s" }
        ));
    }
    if strict && !notes.is_empty() {
        return Err(
            "--strict: empty files, unread subfolders or overrides of no rule (above)".into(),
        );
    }
    println!(
        "valid: {} Tollgate rules, {} envoyproxy/ratelimit domains and {} mode overrides in {} \
         paths",
        checked.loaded.native.len(),
        checked.loaded.envoy.len(),
        checked.loaded.overrides.len(),
        files.len()
    );
    Ok(())
}

fn init_logging(json: bool) {
    // Without traces the subscriber needs no runtime.
    if let Err(e) = tollgate_server::telemetry::init(json, None) {
        eprintln!("tollgate: {e}");
    }
}

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
