//! `tollgate-sim`: run a chaos scenario on virtual time, or sweep one over settings and seeds.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use tollgate_simulations::sweep::{self, Row};
use tollgate_simulations::{Report, Scenario, plot, run};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Chaos simulations of Tollgate nodes on virtual time, running the real node runtime.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs one scenario; exits 1 when an invariant breaks.
    Run {
        /// The scenario file.
        scenario: PathBuf,
        /// The seed (default: the scenario's).
        #[arg(long)]
        seed: Option<u64>,
        /// Writes the whole report as JSON.
        #[arg(long)]
        report: Option<PathBuf>,
        /// Draws admitted against exact per rule, fault windows shaded (SVG, or an HTML page
        /// with the table when the name ends in .html).
        #[arg(long)]
        plot: Option<PathBuf>,
        /// No progress bar.
        #[arg(long)]
        quiet: bool,
        /// Refuses a scenario with warnings (a stream no rule matches, a placeholder that
        /// names no field) instead of running it.
        #[arg(long)]
        strict: bool,
    },
    /// Runs one scenario over values of one setting and over seeds, as a table; exits 1 when
    /// any run breaks an invariant, naming the seed.
    Sweep {
        /// The scenario file.
        scenario: PathBuf,
        /// A setting and its values: PATH=V1,V2, a field of the scenario file
        /// (runtime.lease_ttl=250ms,1s, topology.regions.0.nodes=10,50), a rule's field by its
        /// id (rule.login.failMode=OPEN,CLOSED,LOCAL), or a path into the rules' text
        /// (rules.rules.0.limit=5,10). Repeat it for a grid of every combination.
        #[arg(long)]
        param: Vec<String>,
        /// Seeds: A..B (inclusive) or A,B,C.
        #[arg(long, default_value = "1..5")]
        seeds: String,
        /// Writes every run's values and report as JSON.
        #[arg(long)]
        report: Option<PathBuf>,
        /// Writes an HTML page: the table, and a small plot of each run.
        #[arg(long)]
        plot: Option<PathBuf>,
        /// No progress bar.
        #[arg(long)]
        quiet: bool,
        /// Refuses a scenario with warnings instead of running it.
        #[arg(long)]
        strict: bool,
        /// Runs at once, each on its own thread (default: the machine's cores). Each run
        /// holds its own world: memory grows with them.
        #[arg(long)]
        jobs: Option<usize>,
    },
}

/// Says the scenario's findings on stderr; under `strict`, an error if any is a warning.
fn check_findings(scenario: &Scenario, file: &std::path::Path, strict: bool) -> anyhow::Result<()> {
    let findings = tollgate_simulations::lint::lint(scenario)?;
    for f in &findings {
        let what = if f.is_warning() { "warning" } else { "note" };
        eprintln!("{what}: {}: {f}", file.display());
    }
    let warnings = findings.iter().filter(|f| f.is_warning()).count();
    if strict && warnings > 0 {
        anyhow::bail!(
            "{}: {warnings} warning(s), refused under --strict",
            file.display()
        );
    }
    Ok(())
}

fn bar(total: u64, quiet: bool, what: &str) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} virtual s ({elapsed})")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_owned());
    bar
}

fn main() -> ExitCode {
    match main_() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn main_() -> anyhow::Result<ExitCode> {
    match Cli::parse().command {
        Command::Run {
            scenario,
            seed,
            report,
            plot: plot_to,
            quiet,
            strict,
        } => {
            let s = Scenario::load(&scenario)?;
            check_findings(&s, &scenario, strict)?;
            let seed = seed.unwrap_or(s.seed);
            let progress = bar(s.duration.as_secs(), quiet, &s.name);
            // The machine's time, on purpose: how long the run took to compute.
            #[allow(clippy::disallowed_types)]
            let started = std::time::Instant::now();
            let result = run(&s, seed, &mut |second| progress.set_position(second))?;
            let took = started.elapsed();
            progress.finish_and_clear();
            print!("{}", result.table());
            // Wall time is the machine's, not the run's: said here, kept out of the report
            // (one seed gives one report, byte for byte).
            println!(
                "\nran in {:.1} s of wall time: {:.0} decisions a second",
                took.as_secs_f64(),
                result.decisions as f64 / took.as_secs_f64().max(1e-9)
            );
            write_outputs(&result, report.as_ref(), plot_to.as_ref())?;
            if result.passed() {
                Ok(ExitCode::SUCCESS)
            } else {
                eprintln!(
                    "an invariant broke with seed {seed}: tollgate-sim run {} --seed {seed}",
                    scenario.display()
                );
                Ok(ExitCode::FAILURE)
            }
        }
        Command::Sweep {
            scenario,
            param,
            seeds,
            report,
            plot: plot_to,
            quiet,
            strict,
            jobs,
        } => {
            let text = std::fs::read_to_string(&scenario)
                .map_err(|e| anyhow::anyhow!("{}: {e}", scenario.display()))?;
            let file = scenario.display().to_string();
            let base = Scenario::parse(&text, &file)?;
            check_findings(&base, &scenario, strict)?;
            let seeds = sweep::parse_seeds(&seeds).map_err(anyhow::Error::msg)?;
            let params = if param.is_empty() {
                vec![sweep::Param {
                    path: "(as written)".into(),
                    values: vec!["-".into()],
                }]
            } else {
                param
                    .iter()
                    .map(|p| sweep::parse_param(p))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(anyhow::Error::msg)?
            };
            let combos = sweep::grid(&params);
            let runs = (combos.len() * seeds.len()) as u64;
            let progress = bar(runs * base.duration.as_secs(), quiet, &base.name);
            // Every run of the grid, in the table's order; run on `jobs` threads, each run on
            // its own runtime (one seed, one report, whichever thread runs it).
            let mut planned = vec![];
            for values in combos {
                let s = if param.is_empty() {
                    base.clone()
                } else {
                    let settings: Vec<(&str, &str)> = params
                        .iter()
                        .zip(&values)
                        .map(|(p, v)| (p.path.as_str(), v.as_str()))
                        .collect();
                    sweep::variants(&text, &file, &settings)?
                };
                for &seed in &seeds {
                    planned.push((values.clone(), s.clone(), seed));
                }
            }
            let jobs = jobs
                .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
                .unwrap_or(1)
                .clamp(1, planned.len().max(1));
            let next = std::sync::atomic::AtomicUsize::new(0);
            let done: Vec<std::sync::Mutex<Option<Result<Row, tollgate_simulations::RunError>>>> =
                planned
                    .iter()
                    .map(|_| std::sync::Mutex::new(None))
                    .collect();
            std::thread::scope(|scope| {
                for _ in 0..jobs {
                    scope.spawn(|| {
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let Some((values, s, seed)) = planned.get(i) else {
                                break;
                            };
                            let mut seen = 0;
                            let result = run(s, *seed, &mut |second| {
                                progress.inc(second.saturating_sub(seen));
                                seen = second;
                            })
                            .map(|report| Row {
                                values: values.clone(),
                                report,
                            });
                            if let Ok(mut slot) = done[i].lock() {
                                *slot = Some(result);
                            }
                        }
                    });
                }
            });
            let mut rows = vec![];
            for slot in done {
                let finished = slot
                    .into_inner()
                    .map_err(|_| anyhow::anyhow!("a run's thread panicked"))?;
                match finished {
                    Some(row) => rows.push(row?),
                    None => anyhow::bail!("a run did not finish"),
                }
            }
            progress.finish_and_clear();
            print!("{}", sweep::table(&params, &rows));
            if let Some(path) = report {
                let text = serde_json::to_string_pretty(&rows)?;
                std::fs::write(&path, text + "\n")
                    .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            }
            if let Some(path) = plot_to {
                let page = plot::sweep_html(&base.name, &params, &rows)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
                std::fs::write(&path, page)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            }
            let broken: Vec<&Row> = rows.iter().filter(|r| !r.report.passed()).collect();
            for row in &broken {
                let settings: Vec<String> = params
                    .iter()
                    .zip(&row.values)
                    .map(|(p, v)| format!("{}={v}", p.path))
                    .collect();
                eprintln!(
                    "an invariant broke with {} and seed {}: tollgate-sim run {} --seed {}",
                    settings.join(" "),
                    row.report.seed,
                    scenario.display(),
                    row.report.seed
                );
            }
            Ok(if broken.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}

fn write_outputs(
    report: &Report,
    json: Option<&PathBuf>,
    svg: Option<&PathBuf>,
) -> anyhow::Result<()> {
    if let Some(path) = json {
        let text = serde_json::to_string_pretty(report)?;
        std::fs::write(path, text + "\n")
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    }
    if let Some(path) = svg {
        plot::write(report, path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    }
    Ok(())
}
