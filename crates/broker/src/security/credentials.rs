//! Where SCRAM credentials live: in a cluster, in the controller's replicated metadata
//! (every node authenticates any user); on a single node, in `meta/scram-credentials.json`,
//! written atomically (tmp, fsync, rename) before AlterUserScramCredentials answers.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use sluice_cluster::ScramCredential;

use crate::Broker;

const CREDENTIALS_FILE: &str = "scram-credentials.json";

/// user -> mechanism name -> credential.
pub(crate) type UserCredentials = BTreeMap<String, BTreeMap<String, ScramCredential>>;

/// (user, mechanism name, credential) to add or replace.
pub(crate) type Upsertion = (String, String, ScramCredential);

pub(crate) struct CredentialStore {
    /// Single node: the persisted credentials. `None` in a cluster (the metadata has them).
    local: Option<(PathBuf, Mutex<UserCredentials>)>,
}

impl CredentialStore {
    pub(crate) fn open_local(data_dir: &Path) -> io::Result<CredentialStore> {
        let path = data_dir.join("meta").join(CREDENTIALS_FILE);
        let credentials = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.display())))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => UserCredentials::new(),
            Err(e) => return Err(e),
        };
        Ok(CredentialStore { local: Some((path, Mutex::new(credentials))) })
    }

    pub(crate) fn replicated() -> CredentialStore {
        CredentialStore { local: None }
    }
}

impl Broker {
    /// A user's credential for one SCRAM mechanism, as this node knows it now.
    pub(crate) fn scram_credential(&self, user: &str, mechanism: &str) -> Option<ScramCredential> {
        self.with_scram_credentials(|all| all.get(user).and_then(|m| m.get(mechanism)).cloned())
    }

    pub(crate) fn with_scram_credentials<T>(&self, read: impl FnOnce(&UserCredentials) -> T) -> T {
        match (&self.credentials.local, &self.cluster) {
            (Some((_, local)), _) => read(&local.lock()),
            (None, Some(cluster)) => read(&cluster.metadata().scram_credentials),
            (None, None) => read(&UserCredentials::new()),
        }
    }

    /// Applies validated changes: on a single node persisted before returning, in a
    /// cluster committed by the controller and applied here.
    pub(crate) async fn alter_scram_credentials(
        &self,
        upsertions: Vec<Upsertion>,
        deletions: Vec<(String, String)>,
    ) -> Result<(), crate::handlers::Failure> {
        use kafka_protocol::ResponseError;
        if let Some((path, local)) = &self.credentials.local {
            let mut credentials = local.lock();
            let mut changed = credentials.clone();
            for (user, mechanism) in &deletions {
                if let Some(mechanisms) = changed.get_mut(user) {
                    mechanisms.remove(mechanism);
                    if mechanisms.is_empty() {
                        changed.remove(user);
                    }
                }
            }
            for (user, mechanism, credential) in upsertions {
                changed.entry(user).or_default().insert(mechanism, credential);
            }
            let bytes = serde_json::to_vec(&changed).map_err(|e| (ResponseError::UnknownServerError, e.to_string()))?;
            sluice_storage::write_file_atomically(path, &bytes)
                .map_err(|e| (ResponseError::KafkaStorageError, format!("storing credentials: {e}")))?;
            *credentials = changed;
            return Ok(());
        }
        let controller = crate::handlers::controller(self)?;
        let write = controller.alter_scram_credentials(upsertions, deletions);
        crate::handlers::controller_write(self, write).await
    }
}
