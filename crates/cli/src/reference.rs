//! `sluice completions SHELL` and `sluice manpage`: shell completions (clap_complete) and
//! manual pages (clap_mangen) generated from the command-line definition itself, so they
//! never drift from the flags the binary takes. Both write to stdout (or, for the pages of
//! every subcommand, to a directory) for packagers: the .deb ships them
//! (`packaging/build-deb.sh`).

use std::path::PathBuf;

use anyhow::Context;

#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

#[derive(Debug, clap::Args)]
pub struct ManpageArgs {
    /// Write sluice.1 and a page per subcommand (sluice-serve.1, ...) into DIR instead of
    /// sluice(1) to stdout.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// The name completions and pages are made for (the binary's).
const BINARY: &str = "sluice";

pub fn completions(mut command: clap::Command, args: CompletionsArgs) -> anyhow::Result<()> {
    clap_complete::generate(args.shell, &mut command, BINARY, &mut std::io::stdout());
    Ok(())
}

pub fn manpage(command: clap::Command, args: ManpageArgs) -> anyhow::Result<()> {
    match args.dir {
        None => clap_mangen::Man::new(command).render(&mut std::io::stdout()).context("writing the manual page"),
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            clap_mangen::generate_to(command, &dir)
                .with_context(|| format!("writing manual pages to {}", dir.display()))
        }
    }
}
