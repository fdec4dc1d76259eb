//! `sluice bench`: OpenMessaging-Benchmark workloads against any Kafka-protocol broker.

/// Arguments of `sluice bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {}

/// Runs `sluice bench` with parsed arguments.
pub fn run(_args: BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("sluice bench is not built yet")
}
