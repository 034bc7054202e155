//! An open-loop HTTP load generator for idemgate's overload benchmark
//! (bench/README.md). Request i is due at t0 + i/R whether or not earlier
//! ones were answered, and its latency counts from that instant (no
//! coordinated omission); a request that finds every allowed connection
//! busy is counted as a client overrun, never dropped silently. Prints a
//! line per second and a summary with its own CPU time, and says when it
//! fell behind its schedule.
//!
//! ```text
//! loadgen --url http://127.0.0.1:8080/v1/payments --rate 2000 --duration 10 \
//!     [--rate-file F] [--body-bytes 512] [--key new|none] [--connections-max 1000] \
//!     [--timeout 2s] [--json] [--log FILE] [--threads 1]
//! ```

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use tokio::time::{Instant, sleep};

mod pool;
mod report;
mod request_log;
mod rusage;
mod schedule;
mod settings;
mod shoot;
mod tally;

use schedule::Rate;
use settings::Settings;
use tally::Tally;

fn main() {
    let settings = Settings::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(settings.threads.max(1))
        .enable_all()
        .build()
        .unwrap_or_else(|e| fail(&format!("cannot start the runtime: {e}")));
    runtime.block_on(run(settings));
}

fn fail(why: &str) -> ! {
    eprintln!("loadgen: {why}");
    std::process::exit(2);
}

async fn run(settings: Settings) {
    let authority = settings
        .url
        .authority()
        .map(|a| a.to_string())
        .unwrap_or_else(|| fail("the URL has no host"));
    let pool = Arc::new(pool::Pool::new(authority, settings.connections_max.max(1)));
    let shooter =
        Arc::new(shoot::Shooter::new(&settings, Arc::clone(&pool)).unwrap_or_else(|e| fail(&e)));
    let rate = Arc::new(Rate::new(settings.rate));
    if let Some(path) = settings.rate_file.clone() {
        rate.follow(path);
    }
    let started = std::time::SystemTime::now();
    let tally = Arc::new(Tally::new(Instant::now(), settings.log.is_some()));
    let as_json = settings.json;
    let printer = {
        let tally = Arc::clone(&tally);
        tokio::spawn(async move {
            loop {
                for (i, s) in tally.final_seconds(Instant::now(), false) {
                    println!("{}", report::second(i, &s, as_json));
                }
                sleep(Duration::from_millis(100)).await;
            }
        })
    };
    schedule::run(
        shooter,
        Arc::clone(&tally),
        rate,
        settings.duration,
        settings.timeout,
        settings
            .closed_loop
            .then_some(settings.connections_max.max(1)),
    )
    .await;
    // Every request has a deadline; the margin is for the last ones' tasks.
    let give_up = Instant::now() + settings.timeout + Duration::from_secs(1);
    while tally.outstanding() > 0 && Instant::now() < give_up {
        sleep(Duration::from_millis(10)).await;
    }
    let elapsed = tally.t0.elapsed();
    printer.abort();
    for (i, s) in tally.final_seconds(Instant::now(), true) {
        println!("{}", report::second(i, &s, as_json));
    }
    if let Some(path) = &settings.log
        && let Err(e) = request_log::write(path, tally.entries())
    {
        eprintln!("loadgen: {}: {e}", path.display());
    }
    let (totals, behind) = tally.totals();
    let summary = report::Run {
        url: settings.url.to_string(),
        started,
        rate: settings.rate,
        rate_file: settings.rate_file.is_some(),
        duration: settings.duration,
        elapsed,
        timeout: settings.timeout,
        connections_max: settings.connections_max,
        connections_opened: pool.opened(),
        closed_loop: settings.closed_loop,
        totals: &totals,
        behind: &behind,
        used: rusage::used(),
    };
    println!("{}", summary.summary(as_json));
}
