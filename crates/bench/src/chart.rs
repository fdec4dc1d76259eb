//! Charts (placeholder).
use std::path::{Path, PathBuf};

use crate::result::TestResult;

/// Arguments of `sluice bench chart`.
#[derive(Debug, Clone, clap::Args)]
pub struct ChartArgs {
    /// Result files.
    pub results: Vec<PathBuf>,
}

/// Runs `sluice bench chart`.
pub fn run(_args: ChartArgs) -> anyhow::Result<()> {
    Ok(())
}

/// Writes every chart.
pub fn write_all(_results: &[(String, TestResult)], _folder: &Path) -> anyhow::Result<()> {
    Ok(())
}
