//! A browser with Sluice's web console open on its overview for the whole of a run
//! (`compare --console-viewer`), so that a run measures what the console costs the broker
//! while someone watches: the page's charts redraw themselves every sample interval, as
//! in any browser, and the broker's history sampler runs throughout.
//!
//! The browser is Debian's headless Chromium (the one the console's own browser tests
//! drive), in a profile of its own, stopped when the run ends. Its CPU is the client's,
//! not the broker's: the run's broker figures count only the broker's processes.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

/// The Chromium binary, unless `SLUICE_BENCH_CHROMIUM` names another.
const CHROMIUM: &str = "/usr/bin/chromium";
/// How long the console may take to answer once the broker is ready.
const CONSOLE_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The `sluice serve` arguments that serve the console on `port`, with its defaults.
pub fn serve_args(port: u16) -> Vec<String> {
    vec!["--console-listen".to_string(), format!("127.0.0.1:{port}")]
}

/// A headless Chromium showing the console's overview; closed on drop.
pub struct ConsoleViewer {
    child: Child,
    profile: PathBuf,
}

impl ConsoleViewer {
    /// Opens `http://127.0.0.1:{port}/` once the console answers there.
    pub fn open(port: u16, profile: &Path) -> anyhow::Result<ConsoleViewer> {
        wait_until_listening(port)?;
        let chromium = std::env::var_os("SLUICE_BENCH_CHROMIUM").map(PathBuf::from).unwrap_or(CHROMIUM.into());
        std::fs::create_dir_all(profile)?;
        let mut command = Command::new(&chromium);
        command
            .args(["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--mute-audio"])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg(format!("http://127.0.0.1:{port}/"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = crate::brokers::die_with_parent(&mut command)
            .spawn()
            .with_context(|| format!("starting {} (Debian's chromium package)", chromium.display()))?;
        println!("Console viewer: a headless Chromium (pid {}) on http://127.0.0.1:{port}/", child.id());
        Ok(ConsoleViewer { child, profile: profile.to_path_buf() })
    }
}

impl Drop for ConsoleViewer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

fn wait_until_listening(port: u16) -> anyhow::Result<()> {
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        anyhow::ensure!(
            started.elapsed() < CONSOLE_READY_TIMEOUT,
            "the console did not listen on port {port} within {CONSOLE_READY_TIMEOUT:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}
