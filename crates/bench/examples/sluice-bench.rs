//! Runs `sluice bench` without the `sluice` binary (handy while developing the bench):
//! `cargo run -p sluice-bench --example sluice-bench -- --driver D.yaml W.yaml`.

use clap::Parser;

/// `sluice bench`, standalone.
#[derive(Debug, Parser)]
#[command(name = "sluice-bench")]
struct Cli {
    #[command(flatten)]
    bench: sluice_bench::BenchArgs,
}

fn main() -> anyhow::Result<()> {
    sluice_bench::run(Cli::parse().bench)
}
