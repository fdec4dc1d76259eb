//! Compare (placeholder).

/// Arguments of `sluice bench compare`.
#[derive(Debug, Clone, clap::Args)]
pub struct CompareArgs {}

/// Runs `sluice bench compare`.
pub fn run(_args: CompareArgs) -> anyhow::Result<()> {
    Ok(())
}
