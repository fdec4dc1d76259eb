//! `<data_dir>/meta.properties` (Kafka's file and keys): which node of which cluster a
//! data directory belongs to. Written at the first start in cluster mode, checked at every
//! later one, so a data dir copied to another node or pointed at by a node of another
//! cluster is refused with a clear error instead of silently serving or merging state.
//!
//! It also names the directory itself (`directory.id`, a random UUID in Kafka's base64 form,
//! added to a file that has none): the controller quorum keys a voter by node id *and*
//! directory id, so a node that lost its disk does not vote as if it still had the log, and
//! `kafka-metadata-quorum.sh add-controller` reads it from here.

use std::io;
use std::path::Path;

use base64::Engine;
use uuid::Uuid;

const FILE_NAME: &str = "meta.properties";
const VERSION: &str = "1";

/// The key naming the directory.
const DIRECTORY_ID_KEY: &str = "directory.id";

/// A UUID as Kafka writes it (URL-safe base64 without padding).
pub fn kafka_uuid(uuid: Uuid) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(uuid.as_bytes())
}

fn parse_kafka_uuid(text: &str) -> Option<Uuid> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(text).ok()?;
    Uuid::from_slice(&bytes).ok()
}

/// Checks `data_dir`'s identity against this node's, or records it on first use; returns the
/// directory's id.
pub fn check_or_write(data_dir: &Path, node_id: i32, cluster_id: &str) -> io::Result<Uuid> {
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
            match value(DIRECTORY_ID_KEY) {
                Some(stored) => {
                    parse_kafka_uuid(&stored).ok_or_else(|| refuse(format!("bad {DIRECTORY_ID_KEY} {stored}")))
                }
                None => {
                    let directory_id = Uuid::new_v4();
                    let body =
                        format!("{}{DIRECTORY_ID_KEY}={}\n", with_final_newline(&text), kafka_uuid(directory_id));
                    sluice_storage::write_file_atomically(&path, body.as_bytes())?;
                    Ok(directory_id)
                }
            }
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            let directory_id = Uuid::new_v4();
            let body = format!(
                "version={VERSION}\nnode.id={node_id}\ncluster.id={cluster_id}\n{DIRECTORY_ID_KEY}={}\n",
                kafka_uuid(directory_id)
            );
            sluice_storage::write_file_atomically(&path, body.as_bytes())?;
            Ok(directory_id)
        }
        Err(error) => Err(error),
    }
}

fn with_final_newline(text: &str) -> String {
    match text.is_empty() || text.ends_with('\n') {
        true => text.to_string(),
        false => format!("{text}\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_start_records_identity_and_later_starts_must_match_it() {
        let dir = tempfile::tempdir().unwrap();
        let directory_id = check_or_write(dir.path(), 1, "abc").unwrap();
        assert_eq!(check_or_write(dir.path(), 1, "abc").unwrap(), directory_id, "the directory keeps its id");
        let other_cluster = check_or_write(dir.path(), 1, "xyz").unwrap_err().to_string();
        assert!(other_cluster.contains("belongs to cluster abc"), "{other_cluster}");
        let other_node = check_or_write(dir.path(), 2, "abc").unwrap_err().to_string();
        assert!(other_node.contains("belongs to node 1"), "{other_node}");
    }

    #[test]
    fn a_file_without_a_directory_id_gets_one_in_kafkas_form() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE_NAME), "version=1\nnode.id=3\ncluster.id=abc").unwrap();
        let directory_id = check_or_write(dir.path(), 3, "abc").unwrap();
        let text = std::fs::read_to_string(dir.path().join(FILE_NAME)).unwrap();
        let line = format!("{DIRECTORY_ID_KEY}={}", kafka_uuid(directory_id));
        assert!(text.ends_with(&format!("cluster.id=abc\n{line}\n")), "{text}");
        assert_eq!(kafka_uuid(directory_id).len(), 22, "Kafka's base64 of 16 bytes");
        assert_eq!(check_or_write(dir.path(), 3, "abc").unwrap(), directory_id);
    }
}
