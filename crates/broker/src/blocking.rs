//! Work that must not run on a connection thread: it waits for the disk.

/// Runs `work` on the blocking pool: what creates or deletes logs (directories, files, their
/// fsyncs: seconds for 10,000 partitions) or reads segment files, so the connection threads
/// go on serving every other request meanwhile. A panic in it is the caller's, as on its own
/// thread; `None` when the runtime shuts down first.
pub(crate) async fn on_blocking_pool<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    match tokio::task::spawn_blocking(work).await {
        Ok(done) => Some(done),
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        Err(_) => None,
    }
}
