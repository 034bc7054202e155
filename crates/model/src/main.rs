//! `idemgate-model`: check the record's model, or explore it.
//!
//! ```text
//! cargo run --release -p idemgate-model -- check [--policy inquire] [--mutation write-ignores-token]
//! cargo run --release -p idemgate-model -- explore [--policy inquire] [--listen 127.0.0.1:3000]
//! ```

use clap::{Parser, Subcommand, ValueEnum};
use idemgate_core::UnknownOutcome;
use idemgate_model::{Mutation, bounded};
use stateright::report::WriteReporter;
use stateright::{Checker, Model};

/// Check or explore idemgate's record model.
#[derive(Debug, Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check every property over the bounded space and print the counts.
    Check {
        /// The route's policy for unknown outcomes.
        #[arg(long, value_enum, default_value_t = Policy::Inquire)]
        policy: Policy,
        /// Plant one bug (a negative control).
        #[arg(long, value_enum)]
        mutation: Option<Planted>,
    },
    /// Serve Stateright's explorer.
    Explore {
        /// The route's policy for unknown outcomes.
        #[arg(long, value_enum, default_value_t = Policy::Inquire)]
        policy: Policy,
        /// Plant one bug.
        #[arg(long, value_enum)]
        mutation: Option<Planted>,
        /// Where the explorer listens.
        #[arg(long, default_value = "127.0.0.1:3000")]
        listen: String,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Policy {
    Hold,
    Release,
    Inquire,
}

impl From<Policy> for UnknownOutcome {
    fn from(policy: Policy) -> Self {
        match policy {
            Policy::Hold => UnknownOutcome::Hold,
            Policy::Release => UnknownOutcome::Release,
            Policy::Inquire => UnknownOutcome::Inquire,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Planted {
    WriteIgnoresToken,
    ClaimOverLiveLease,
    ReleaseInquiringInsideAfter,
    InquiryAnswerAfterNewerToken,
}

impl From<Planted> for Mutation {
    fn from(planted: Planted) -> Self {
        match planted {
            Planted::WriteIgnoresToken => Mutation::WriteIgnoresToken,
            Planted::ClaimOverLiveLease => Mutation::ClaimOverLiveLease,
            Planted::ReleaseInquiringInsideAfter => Mutation::ReleaseInquiringInsideAfter,
            Planted::InquiryAnswerAfterNewerToken => Mutation::InquiryAnswerAfterNewerToken,
        }
    }
}

/// The cores this process may use: the checker's threads.
fn host_cores() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

fn main() {
    match Cli::parse().command {
        Command::Check { policy, mutation } => {
            let model = bounded(policy.into(), mutation.map(Into::into));
            let mut stdout = std::io::stdout();
            let checker = model
                .checker()
                .threads(host_cores())
                .spawn_bfs()
                .report(&mut WriteReporter::new(&mut stdout));
            checker.assert_properties();
            println!("every property holds");
        }
        Command::Explore {
            policy,
            mutation,
            listen,
        } => {
            let model = bounded(policy.into(), mutation.map(Into::into));
            println!("exploring on http://{listen}");
            model.checker().serve(listen.as_str());
        }
    }
}
