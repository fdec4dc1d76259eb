//! `sluice-lossyfs`: mounts a view of a directory that loses every write not fsynced when
//! told to, for Sluice's power-loss tests. Runs until SIGTERM or SIGINT (then unmounts,
//! making everything durable); SIGUSR1 or `crash` written to `<mount>/.lossyfs-control` is
//! a power cut. Needs root and /dev/fuse (it mounts with mount(2), no fusermount).
//!
//! What a power cut loses (`fs.rs` has the details): every byte not covered by a successful
//! fsync, fdatasync or synchronous (`O_DSYNC`, `RWF_DSYNC`) write, whatever the open flags,
//! `O_DIRECT` included, and every file size not synced; fallocated space reads as zeros.
//! Names are durable at once unless `--lose-unsynced-dir-entries`, which keeps a created,
//! removed or renamed name only once its directory is fsynced. `--split-direct-writes`
//! (with `--page-cache`) damages a direct write larger than one request as LazyFS's
//! concurrent handling of its pieces can. Torn writes are not modelled.

mod fs;
mod journal;

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use clap::Parser;
use fuser::MountOption;

use crate::fs::{LossyFs, LossyState, OpenMode, Strictness};

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
    /// A created, removed or renamed name is durable only once its directory is fsynced (for
    /// a rename: the destination's); a crash undoes the others. Default: durable at once.
    #[arg(long)]
    lose_unsynced_dir_entries: bool,
    /// With --page-cache: a direct-I/O write the kernel splits into several requests has the
    /// gap before each later piece refilled with zeros over the earlier pieces, as a daemon
    /// handling the pieces concurrently can (LazyFS).
    #[arg(long)]
    split_direct_writes: bool,
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
    if args.split_direct_writes && !args.page_cache {
        anyhow::bail!(
            "--split-direct-writes needs --page-cache: with direct-I/O files (the default) the kernel \
             sends the pieces of a synchronous write one after another, so none is split concurrently"
        );
    }
    let strictness = Strictness {
        lose_unsynced_dir_entries: args.lose_unsynced_dir_entries,
        split_direct_writes: args.split_direct_writes,
    };
    let state = Arc::new(Mutex::new(
        LossyState::new(&args.backing, strictness)
            .with_context(|| format!("backing directory {}", args.backing.display()))?,
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
            eprintln!("lossyfs: crash (SIGUSR1): {}", dropped.describe());
            continue;
        }
        break;
    }
    drop(session);
    println!("lossyfs: unmounted {}", args.mount.display());
    Ok(())
}
