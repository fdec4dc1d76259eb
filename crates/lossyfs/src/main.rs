//! `sluice-lossyfs`: mounts a view of a directory that loses every write not fsynced when
//! told to, for Sluice's power-loss tests (see `fs.rs` for the model). Runs until SIGTERM or
//! SIGINT (then unmounts); SIGUSR1 or `crash` written to `<mount>/.lossyfs-control` drops
//! all unsynced data. Needs root and /dev/fuse (it mounts with mount(2), no fusermount).

mod fs;

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use clap::Parser;
use fuser::MountOption;

use crate::fs::{LossyFs, LossyState, OpenMode};

#[derive(Parser)]
#[command(name = "sluice-lossyfs", about = "A FUSE filesystem that drops unsynced writes on command")]
struct Args {
    /// The directory that holds what survives.
    #[arg(long)]
    backing: PathBuf,
    /// Where to mount the lossy view.
    #[arg(long)]
    mount: PathBuf,
    /// Files go through the kernel page cache, so programs can mmap them (Kafka's indexes);
    /// default: direct I/O, exact after a crash (see fs.rs).
    #[arg(long)]
    page_cache: bool,
}

/// Blocks `signals` in this thread (and threads spawned after) so `sigwait` receives them.
fn block_signals(signals: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: plain libc signal-set manipulation on a set we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &signal in signals {
            libc::sigaddset(&mut set, signal);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let state = Arc::new(Mutex::new(
        LossyState::new(&args.backing).with_context(|| format!("backing directory {}", args.backing.display()))?,
    ));
    let signals = block_signals(&[libc::SIGTERM, libc::SIGINT, libc::SIGUSR1]);
    let options = [MountOption::FSName("sluice-lossyfs".into()), MountOption::RW, MountOption::NoAtime];
    let session = fuser::spawn_mount2(
        LossyFs::new(state.clone(), if args.page_cache { OpenMode::PageCache } else { OpenMode::DirectIo }),
        &args.mount,
        &options,
    )
    .with_context(|| format!("mounting {}", args.mount.display()))?;
    println!("lossyfs: mounted {} on {}", args.backing.display(), args.mount.display());
    std::io::stdout().flush()?;
    loop {
        let mut signal: libc::c_int = 0;
        // SAFETY: waits for one of the signals blocked above.
        if unsafe { libc::sigwait(&signals, &mut signal) } != 0 {
            continue;
        }
        if signal == libc::SIGUSR1 {
            let dropped = state.lock().unwrap_or_else(|p| p.into_inner()).crash();
            eprintln!(
                "lossyfs: crash (SIGUSR1): dropped unsynced data of {} files ({} pages)",
                dropped.files, dropped.pages
            );
            continue;
        }
        break;
    }
    drop(session);
    println!("lossyfs: unmounted {}", args.mount.display());
    Ok(())
}
