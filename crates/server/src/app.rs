//! A whole node process: store, rules (loaded, then watched), the decision runtime and both
//! servers, wired from a [`Config`] and stopped by one shutdown signal, after which every
//! unspent lease is returned.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tollgate_lease::{MemoryConfig, MemoryStore, RedisStore, Store, TokioClock};

use crate::config::Config;
use crate::tls::Acceptor;
use tollgate_control::admin::AdminState;
use tollgate_control::auth::Tokens;
use tollgate_control::store::{ControlError, RuleStore};
use tollgate_control::sync::{RuleSync, SyncConfig};
use tollgate_node::metrics::Metrics;
use tollgate_node::rules::watch::{ActiveRules, watch as watch_rules};
use tollgate_node::runtime::Node;
use tollgate_regionsync::RegionSync;

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A rule file is invalid.
    #[error("{0}")]
    Rules(#[from] tollgate_node::rules::RulesError),
    /// The store could not be set up.
    #[error("store: {0}")]
    Store(#[from] tollgate_lease::StoreError),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The runtime's actors could not start.
    #[error("runtime: {0}")]
    Runtime(#[from] ractor::SpawnErr),
    /// The rule store could not be set up.
    #[error("rule store: {0}")]
    Control(#[from] ControlError),
    /// Region sync could not start.
    #[error("region sync: {0}")]
    Region(#[from] tollgate_regionsync::StartError),
    /// A setting is invalid.
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
    /// A TLS file is missing or does not load.
    #[error("TLS: {0}")]
    Tls(#[from] crate::tls::TlsError),
}

/// Each listener's TLS, when a certificate is configured.
#[derive(Debug, Clone)]
struct Acceptors {
    grpc: Acceptor,
    http: Acceptor,
    admin: Acceptor,
    region: Acceptor,
}

/// A started node process.
#[derive(Debug)]
pub struct App {
    /// The decision runtime.
    pub node: Node,
    /// Where gRPC listens.
    pub grpc_addr: std::net::SocketAddr,
    /// Where HTTP listens.
    pub http_addr: std::net::SocketAddr,
    /// Where the plaintext probe port listens, when asked for.
    pub probe_addr: Option<std::net::SocketAddr>,
    /// Where the admin API listens, when a rule store is configured.
    pub admin_addr: Option<std::net::SocketAddr>,
    /// Where the region link listens, when the node runs in one of two regions.
    pub region_addr: Option<std::net::SocketAddr>,
    region: Option<(Arc<RegionSync>, TcpListener)>,
    grpc: TcpListener,
    http: TcpListener,
    probes: Option<TcpListener>,
    control: Option<(RuleSync, TcpListener, AdminState)>,
    tls: Option<Acceptors>,
    config: Config,
}

impl App {
    /// Loads the rules, opens the store, starts the runtime, warms the store up (connected,
    /// scripts loaded, one round trip; up to the start-up patience) and binds the listeners.
    /// A rule file error stops the start; Redis being down does not (past the patience, the
    /// node serves per fail mode and connects in the background).
    ///
    /// Long on purpose: the whole start-up in the order it happens, each part a call of its
    /// own module, so that an operator reading a start-up log can follow it here.
    pub async fn start(config: Config) -> Result<App, StartError> {
        let metrics = if config.region.is_some() {
            Metrics::with_regions()
        } else {
            Metrics::new()
        };
        let rules = ActiveRules::new(metrics.clone());
        rules.set_envoy_fail_modes(config.envoy_fail_modes.clone());
        let control = match &config.control {
            None => {
                rules.install_files(&config.rules)?;
                rules.set_source("files", true);
                None
            }
            Some(control) => {
                let store = RuleStore::new(&control.database_url, Duration::from_secs(2))?
                    .beside_rule_files(&config.rules);
                let sync = RuleSync::new(
                    store.clone(),
                    rules.clone(),
                    SyncConfig {
                        poll: control.poll,
                        listen: control.listen,
                        snapshot: Some(control.snapshot.clone()),
                        files: config.rules.clone(),
                    },
                );
                sync.initial_load().await?;
                // Validated with the configuration: an empty secret never gets this far.
                let tokens = Tokens::parse(&control.admin_tokens, &control.admin_read_tokens)
                    .map_err(|reason| {
                        StartError::Config(crate::config::ConfigError {
                            field: "admin_tokens".into(),
                            reason,
                        })
                    })?;
                let admin_addr = if tokens.any() || control.admin_listen.ip().is_loopback() {
                    control.admin_listen
                } else {
                    let loopback = if control.admin_listen.is_ipv6() {
                        std::net::IpAddr::from(std::net::Ipv6Addr::LOCALHOST)
                    } else {
                        std::net::IpAddr::from(std::net::Ipv4Addr::LOCALHOST)
                    };
                    let addr = SocketAddr::new(loopback, control.admin_listen.port());
                    tracing::warn!(
                        configured = %control.admin_listen,
                        listening = %addr,
                        "no admin token configured: the admin API listens on loopback only"
                    );
                    addr
                };
                let admin =
                    TcpListener::bind(admin_addr)
                        .await
                        .map_err(|source| StartError::Listen {
                            addr: admin_addr,
                            source,
                        })?;
                let state = AdminState {
                    store,
                    tokens,
                    default_domain: control.default_domain.clone(),
                    client_timeout: control.admin_client_timeout,
                    node: None,
                    tls: false,
                };
                Some((sync, admin, state))
            }
        };
        let clock = Arc::new(TokioClock::new());
        let store = match &config.redis {
            Some(redis) => Store::Redis(RedisStore::open(redis)?),
            None => Store::Memory(MemoryStore::with_clock(
                clock.clone(),
                MemoryConfig {
                    max_bytes: config.memory_max_bytes,
                    ..MemoryConfig::default()
                },
            )),
        };
        let node = Node::start(
            store.clone(),
            rules,
            config.runtime.clone(),
            clock.clone(),
            metrics.clone(),
            config.store_timeout,
        )
        .await?;
        // The store is warmed up before any listener accepts: a fresh node's first calls
        // (the connection set up, the scripts loaded) must not be its first requests'.
        node.warm_up().await;
        let bind = |addr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|source| StartError::Listen { addr, source })
        };
        let region = match &config.region {
            None => None,
            Some(settings) => {
                let region = RegionSync::start(
                    settings.sync.clone(),
                    // Region sync is off the request path: its store calls (the peer's
                    // consumption, demand reports) wait for a busy store up to the patience,
                    // as a late lease does; judged by the 5 ms budget, a busy node's batches
                    // were refused and the peer counted down.
                    store.with_budget(config.runtime.store_patience),
                    node.region().host(),
                    metrics.region.clone(),
                    clock,
                )
                .await?;
                let _ = node.region().attach(region.clone());
                if let Err(e) = node.rules().set_region_view(Some(region.view())) {
                    tracing::error!(error = %e, "rules do not compile for the regions' state");
                }
                Some((region, bind(settings.listen).await?))
            }
        };
        let region_addr = match &region {
            Some((_, listener)) => {
                Some(listener.local_addr().map_err(|source| StartError::Listen {
                    addr: config.grpc_listen,
                    source,
                })?)
            }
            None => None,
        };
        let grpc = bind(config.grpc_listen).await?;
        let http = bind(config.http_listen).await?;
        let probes = match config.probe_listen {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        let probe_addr = match &probes {
            Some(listener) => Some(listener.local_addr().map_err(|source| StartError::Listen {
                addr: config.http_listen,
                source,
            })?),
            None => None,
        };
        let grpc_addr = grpc.local_addr().map_err(|source| StartError::Listen {
            addr: config.grpc_listen,
            source,
        })?;
        let http_addr = http.local_addr().map_err(|source| StartError::Listen {
            addr: config.http_listen,
            source,
        })?;
        let admin_addr = match &control {
            Some((_, listener, _)) => {
                Some(listener.local_addr().map_err(|source| StartError::Listen {
                    addr: config.http_listen,
                    source,
                })?)
            }
            None => None,
        };
        let tls = match &config.tls {
            None => None,
            Some(t) => {
                // Listeners asking for the same client CA (or none) share one configuration,
                // and one look at its files.
                let mut started: Vec<(Option<std::path::PathBuf>, Acceptor)> = vec![];
                let mut acceptor =
                    |client_ca: Option<&std::path::PathBuf>| -> Result<Acceptor, StartError> {
                        if let Some((_, a)) =
                            started.iter().find(|(ca, _)| ca.as_ref() == client_ca)
                        {
                            return Ok(a.clone());
                        }
                        let a =
                            Acceptor::start(t.files(client_ca), t.reload, node.metrics().clone())?;
                        started.push((client_ca.cloned(), a.clone()));
                        Ok(a)
                    };
                Some(Acceptors {
                    grpc: acceptor(t.grpc_client_ca.as_ref())?,
                    http: acceptor(None)?,
                    admin: acceptor(None)?,
                    region: acceptor(t.region_client_ca.as_ref())?,
                })
            }
        };
        Ok(App {
            node,
            tls,
            grpc_addr,
            http_addr,
            probe_addr,
            admin_addr,
            region_addr,
            region,
            grpc,
            http,
            probes,
            control,
            config,
        })
    }

    /// Serves in a background task until [`Serving::stop`] (tests, benchmarks, a process that
    /// embeds a node).
    pub fn spawn(self) -> Serving {
        let (node, grpc_addr, http_addr, probe_addr, admin_addr, region_addr) = (
            self.node.clone(),
            self.grpc_addr,
            self.http_addr,
            self.probe_addr,
            self.admin_addr,
            self.region_addr,
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(self.run(async move {
            let _ = stopped.await;
        }));
        Serving {
            node,
            grpc_addr,
            http_addr,
            probe_addr,
            admin_addr,
            region_addr,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Serves until `shutdown`, then returns the node's unspent leases.
    ///
    /// Every listener and background task started and stopped in one place, in order (the
    /// stop undoes the start): longer than most, and read top to bottom.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()> + Send + 'static) {
        let (stop_tx, stop_rx) = watch::channel(false);
        let stopped = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let optional = |addr: Option<SocketAddr>| addr.map_or("off".to_owned(), |a| a.to_string());
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        tracing::info!(
            grpc = %self.grpc_addr,
            http = %self.http_addr,
            admin = %optional(self.admin_addr),
            console = %self.admin_addr.map_or("off".to_owned(), |a| format!("{scheme}://{a}/console")),
            region_link = %optional(self.region_addr),
            store = if self.config.redis.is_some() { "redis" } else { "memory" },
            rules = self.node.rules().load().rules().len(),
            worker_threads = self.config.worker_threads,
            "tollgate node serving"
        );
        let watcher = match self.control {
            // With a rule store, PostgreSQL drives reloads (rule files are reloaded with it).
            Some((sync, admin, mut state)) => {
                state.node = Some(self.node.clone());
                state.tls = self.tls.is_some();
                let admin = tokio::spawn(crate::admin_listener::serve(
                    state,
                    admin,
                    self.tls.as_ref().map(|t| t.admin.clone()),
                    self.node.metrics().clone(),
                    stopped(stop_rx.clone()),
                ));
                let follow = tokio::spawn(
                    sync.with_node(self.node.clone())
                        .run(stopped(stop_rx.clone())),
                );
                tokio::spawn(async move {
                    let _ = tokio::join!(admin, follow);
                })
            }
            None => tokio::spawn(watch_rules(
                self.config.rules.clone(),
                self.node.rules().clone(),
                self.config.rules_reload,
                stopped(stop_rx.clone()),
            )),
        };
        let grpc = tokio::spawn(crate::grpc::server::serve(
            self.node.clone(),
            self.config.rlqs.clone(),
            self.config.x_ratelimit_headers,
            self.grpc,
            self.tls.as_ref().map(|t| t.grpc.clone()),
            stopped(stop_rx.clone()),
        ));
        let probes = self.probes.map(|listener| {
            tokio::spawn(crate::http::serve_probes(
                self.node.clone(),
                listener,
                stopped(stop_rx.clone()),
            ))
        });
        let json_check = self.config.json_check.then(|| {
            crate::json_check::JsonCheck::new(
                crate::grpc::rls::Rls::new(self.node.clone())
                    .with_x_ratelimit_headers(self.config.x_ratelimit_headers),
                self.config.json_check_token.clone(),
            )
        });
        let http = tokio::spawn(crate::http::serve(
            self.node.clone(),
            self.config.top_denied_token.clone(),
            json_check,
            self.http,
            self.tls.as_ref().map(|t| t.http.clone()),
            stopped(stop_rx.clone()),
        ));
        let region = self.region.map(|(region, listener)| {
            let link = tokio::spawn({
                let region = region.clone();
                let stop = stopped(stop_rx.clone());
                let tls = self.tls.as_ref().map(|t| t.region.clone());
                use crate::listener::{Bounds, OpeningRule, Protocol};
                let metrics = self.node.metrics();
                let connections = crate::listener::accept(listener, Bounds::REGION_LINK, metrics);
                let opening = OpeningRule::new(Protocol::Http2, &Bounds::REGION_LINK, metrics);
                async move {
                    // The link's own service on a gRPC server with every gRPC port's bounds.
                    let server =
                        crate::listener::grpc_server().add_service(region.service().into_server());
                    let served = match tls {
                        None => {
                            server
                                .serve_with_incoming_shutdown(opening.open_all(connections), stop)
                                .await
                        }
                        Some(acceptor) => {
                            server
                                .serve_with_incoming_shutdown(
                                    opening.open_all(crate::tls::incoming(
                                        connections,
                                        acceptor,
                                        Bounds::REGION_LINK.name,
                                    )),
                                    stop,
                                )
                                .await
                        }
                    };
                    if let Err(e) = served {
                        tracing::error!(error = %e, "the region link server failed");
                    }
                }
            });
            // The peer going down or coming back moves SPLIT shares: recompile the rules.
            let follow = tokio::spawn({
                let node = self.node.clone();
                let mut stop = stop_rx.clone();
                async move {
                    tokio::select! {
                        () = node.region().follow_view() => {}
                        _ = stop.wait_for(|s| *s) => {}
                    }
                }
            });
            (region, link, follow)
        });
        shutdown.await;
        tracing::info!("shutting down: returning unspent leases");
        let _ = stop_tx.send(true);
        let _ = tokio::join!(watcher, grpc, http);
        if let Some(probes) = probes {
            let _ = probes.await;
        }
        if let Some((region, link, follow)) = region {
            region.stop().await;
            let _ = tokio::join!(link, follow);
        }
        self.node.shutdown().await;
    }
}

/// A node serving in a background task ([`App::spawn`]).
#[derive(Debug)]
pub struct Serving {
    /// The decision runtime.
    pub node: Node,
    /// Where gRPC listens.
    pub grpc_addr: SocketAddr,
    /// Where HTTP listens.
    pub http_addr: SocketAddr,
    /// Where the plaintext probe port listens, when asked for.
    pub probe_addr: Option<SocketAddr>,
    /// Where the admin API listens, when a rule store is configured.
    pub admin_addr: Option<SocketAddr>,
    /// Where the region link listens, when the node runs in one of two regions.
    pub region_addr: Option<SocketAddr>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Serving {
    /// Stops serving and waits until the node has returned its leases. Stopping twice is a
    /// no-op; a panic in the serving task is raised here.
    pub async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take()
            && let Err(e) = task.await
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}
