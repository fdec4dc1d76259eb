//! `<data_dir>/meta.properties` (Kafka's file and keys): which node of which cluster a
//! data directory belongs to. Written at the first start in cluster mode, checked at every
//! later one, so a data dir copied to another node or pointed at by a node of another
//! cluster is refused with a clear error instead of silently serving or merging state.

use std::io;
use std::path::Path;

const FILE_NAME: &str = "meta.properties";
const VERSION: &str = "1";

/// Checks `data_dir`'s identity against this node's, or records it on first use.
pub fn check_or_write(data_dir: &Path, node_id: i32, cluster_id: &str) -> io::Result<()> {
    let path = data_dir.join(FILE_NAME);
    let refuse = |what: String| io::Error::new(io::ErrorKind::InvalidInput, format!("{}: {what}", path.display()));
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let value = |key: &str| {
                text.lines()
                    .filter_map(|line| line.split_once('='))
                    .find(|(k, _)| k.trim() == key)
                    .map(|(_, v)| v.trim().to_string())
            };
            let stored_cluster = value("cluster.id").ok_or_else(|| refuse("no cluster.id".into()))?;
            let stored_node = value("node.id").ok_or_else(|| refuse("no node.id".into()))?;
            if stored_node != node_id.to_string() {
                return Err(refuse(format!("the data directory belongs to node {stored_node}, not node {node_id}")));
            }
            if stored_cluster != cluster_id {
                return Err(refuse(format!(
                    "the data directory belongs to cluster {stored_cluster}, but this node is configured for \
                     cluster {cluster_id} (cluster id or voters changed?)"
                )));
            }
            Ok(())
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            let body = format!("version={VERSION}\nnode.id={node_id}\ncluster.id={cluster_id}\n");
            sluice_storage::write_file_atomically(&path, body.as_bytes())
        }
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_start_records_identity_and_later_starts_must_match_it() {
        let dir = tempfile::tempdir().unwrap();
        check_or_write(dir.path(), 1, "abc").unwrap();
        check_or_write(dir.path(), 1, "abc").unwrap();
        let other_cluster = check_or_write(dir.path(), 1, "xyz").unwrap_err().to_string();
        assert!(other_cluster.contains("belongs to cluster abc"), "{other_cluster}");
        let other_node = check_or_write(dir.path(), 2, "abc").unwrap_err().to_string();
        assert!(other_node.contains("belongs to node 1"), "{other_node}");
    }
}
