//! Every workload and driver file shipped in `bench/` parses, without warnings, and
//! every payload file a workload names exists with the workload's message size.

use std::path::{Path, PathBuf};

use sluice_bench::driver::Driver;
use sluice_bench::runner::resolve_payload;
use sluice_bench::workload::Workload;

fn bench_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench")
}

fn yaml_files(folder: &str) -> Vec<PathBuf> {
    let dir = bench_dir().join(folder);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_shipped_workload_parses() {
    let mut count = 0;
    for folder in ["workloads", "local/workloads"] {
        for path in yaml_files(folder) {
            let loaded = Workload::load(&path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
            assert!(loaded.warnings.is_empty(), "{}: {:?}", path.display(), loaded.warnings);
            let workload = &loaded.workload;
            if let Some(file) = &workload.payload_file {
                let payload = resolve_payload(&path, file)
                    .unwrap_or_else(|| panic!("{}: payload {file} not found", path.display()));
                let size = std::fs::metadata(&payload).unwrap().len();
                assert_eq!(size, u64::from(workload.message_size), "{}", path.display());
            }
            count += 1;
        }
    }
    assert!(count >= 25, "only {count} workloads shipped");
}

#[test]
fn every_shipped_driver_parses() {
    let mut count = 0;
    for folder in ["drivers", "local/drivers"] {
        for path in yaml_files(folder) {
            let loaded = Driver::load(&path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
            assert!(loaded.warnings.is_empty(), "{}: {:?}", path.display(), loaded.warnings);
            assert!(loaded.driver.common_setting("bootstrap.servers").is_some());
            assert!(!loaded.driver.producer_config.is_empty());
            count += 1;
        }
    }
    assert!(count >= 8, "only {count} drivers shipped");
}

#[test]
fn fsync_drivers_say_so() {
    for path in yaml_files("drivers").into_iter().chain(yaml_files("local/drivers")) {
        let driver = Driver::load(&path).unwrap().driver;
        let named_fsync = path.to_string_lossy().contains("fsync");
        assert_eq!(driver.fsync_each_message(), named_fsync, "{}", path.display());
    }
}
