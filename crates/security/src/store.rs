//! Where SCRAM credentials, ACLs and client quotas live: in a cluster, in the controller's replicated
//! metadata (every node authenticates and authorizes alike); on a single node, in
//! `meta/security.json`, written atomically (tmp, fsync, rename) before the admin request
//! that changed it is answered.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use sluice_cluster::{AclBinding, ClusterMetadata, QuotaEntity, ScramCredential};

use crate::quota::QuotaManager;

const SECURITY_FILE: &str = "security.json";

/// An admin request's refusal: the Kafka error and a message for the client.
pub type Failure = (kafka_protocol::ResponseError, String);

/// user -> mechanism name -> credential.
pub type UserCredentials = BTreeMap<String, BTreeMap<String, ScramCredential>>;

/// (user, mechanism name, credential) to add or replace.
pub type Upsertion = (String, String, ScramCredential);

/// A single node's security state, as persisted.
#[derive(Default, Clone, Serialize, Deserialize)]
struct LocalSecurity {
    #[serde(default)]
    scram_credentials: UserCredentials,
    #[serde(default)]
    acls: BTreeSet<AclBinding>,
    #[serde(default, with = "quotas_as_list")]
    client_quotas: ClientQuotas,
}

/// Client quotas as a JSON list of pairs (JSON object keys must be strings).
mod quotas_as_list {
    use serde::{Deserialize, Deserializer, Serializer};

    use super::ClientQuotas;

    pub(super) fn serialize<S: Serializer>(quotas: &ClientQuotas, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(quotas.iter())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<ClientQuotas, D::Error> {
        Ok(Vec::deserialize(deserializer)?.into_iter().collect())
    }
}

pub use crate::quota::ClientQuotas;

pub struct SecurityStore {
    /// Single node: the persisted state. `None` in a cluster (the metadata has it).
    local: Option<(PathBuf, Mutex<LocalSecurity>)>,
}

impl SecurityStore {
    pub fn open_local(data_dir: &Path) -> io::Result<SecurityStore> {
        let path = data_dir.join("meta").join(SECURITY_FILE);
        let state = match std::fs::read(&path) {
            Ok(bytes) => {
                keep_private(&path)?;
                serde_json::from_slice(&bytes)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.display())))?
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => LocalSecurity::default(),
            Err(e) => return Err(e),
        };
        Ok(SecurityStore { local: Some((path, Mutex::new(state))) })
    }

    pub fn replicated() -> SecurityStore {
        SecurityStore { local: None }
    }

    /// Reads the local (single-node) client quotas; none in a cluster.
    pub fn with_local_quotas(&self, read: impl FnOnce(&ClientQuotas)) {
        match &self.local {
            Some((_, state)) => read(&state.lock().client_quotas),
            None => read(&ClientQuotas::new()),
        }
    }
}

/// Makes a credentials file readable by its owner only when it is readable by others
/// (copied in, restored from a backup): it holds SCRAM keys.
fn keep_private(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)?.permissions().mode();
    if mode & 0o077 != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        tracing::warn!(path = %path.display(), mode = format!("{:o}", mode & 0o777), "credentials file was readable by others; made it 0600");
    }
    Ok(())
}

/// Persists a changed copy of the local state, then installs it.
fn store_local(path: &Path, current: &mut LocalSecurity, changed: LocalSecurity) -> Result<(), Failure> {
    use kafka_protocol::ResponseError;
    let bytes = serde_json::to_vec(&changed).map_err(|e| (ResponseError::UnknownServerError, e.to_string()))?;
    sluice_storage::write_private_file_atomically(path, &bytes)
        .map_err(|e| (ResponseError::KafkaStorageError, format!("storing {}: {e}", path.display())))?;
    *current = changed;
    Ok(())
}

/// The replicated side of the security state: in a cluster, SCRAM credentials, ACLs and
/// client quotas are records of the controller's metadata, written through the controller.
pub trait SecurityController {
    /// The cluster metadata this node has applied; `None` outside a cluster.
    fn applied_metadata(&self) -> Option<Arc<ClusterMetadata>>;

    /// Commits credential changes through the controller; returns once applied here.
    fn write_scram_credentials(
        &self,
        upsertions: Vec<Upsertion>,
        deletions: Vec<(String, String)>,
    ) -> impl Future<Output = Result<(), Failure>> + Send;

    /// Commits quota changes through the controller; returns once applied here.
    fn write_client_quotas(
        &self,
        changes: Vec<(QuotaEntity, String, Option<u64>)>,
    ) -> impl Future<Output = Result<(), Failure>> + Send;

    /// Commits ACL changes through the controller; returns once applied here.
    fn write_acls(
        &self,
        create: Vec<AclBinding>,
        delete: Vec<AclBinding>,
    ) -> impl Future<Output = Result<(), Failure>> + Send;
}

impl SecurityStore {
    /// Reads the SCRAM credentials: the local ones, else the cluster's.
    pub fn with_scram_credentials<T>(
        &self,
        cluster: &impl SecurityController,
        read: impl FnOnce(&UserCredentials) -> T,
    ) -> T {
        if let Some((_, local)) = &self.local {
            return read(&local.lock().scram_credentials);
        }
        match cluster.applied_metadata() {
            Some(metadata) => read(&metadata.scram_credentials),
            None => read(&UserCredentials::new()),
        }
    }

    /// Reads the ACLs: the local ones, else the cluster's.
    pub fn with_acls<T>(&self, cluster: &impl SecurityController, read: impl FnOnce(&BTreeSet<AclBinding>) -> T) -> T {
        if let Some((_, local)) = &self.local {
            return read(&local.lock().acls);
        }
        match cluster.applied_metadata() {
            Some(metadata) => read(&metadata.acls),
            None => read(&BTreeSet::new()),
        }
    }

    /// Reads the client quotas: the local ones, else the cluster's.
    pub fn with_client_quotas<T>(&self, cluster: &impl SecurityController, read: impl FnOnce(&ClientQuotas) -> T) -> T {
        if let Some((_, local)) = &self.local {
            return read(&local.lock().client_quotas);
        }
        match cluster.applied_metadata() {
            Some(metadata) => read(&metadata.client_quotas),
            None => read(&ClientQuotas::new()),
        }
    }

    /// Applies validated credential changes: on a single node persisted before returning,
    /// in a cluster committed by the controller and applied here.
    pub async fn alter_scram_credentials(
        &self,
        cluster: &impl SecurityController,
        upsertions: Vec<Upsertion>,
        deletions: Vec<(String, String)>,
    ) -> Result<(), Failure> {
        if let Some((path, local)) = &self.local {
            let mut current = local.lock();
            let mut changed = current.clone();
            for (user, mechanism) in &deletions {
                if let Some(mechanisms) = changed.scram_credentials.get_mut(user) {
                    mechanisms.remove(mechanism);
                    if mechanisms.is_empty() {
                        changed.scram_credentials.remove(user);
                    }
                }
            }
            for (user, mechanism, credential) in upsertions {
                changed.scram_credentials.entry(user).or_default().insert(mechanism, credential);
            }
            return store_local(path, &mut current, changed);
        }
        cluster.write_scram_credentials(upsertions, deletions).await
    }

    /// Sets (`Some`) or removes (`None`) validated quota values, durably, as one change;
    /// on a single node `quotas` learns whether any quota is left.
    pub async fn alter_client_quotas(
        &self,
        cluster: &impl SecurityController,
        quotas: &QuotaManager,
        changes: Vec<(QuotaEntity, String, Option<u64>)>,
    ) -> Result<(), Failure> {
        if let Some((path, local)) = &self.local {
            let mut current = local.lock();
            let mut changed = current.clone();
            let client_quotas = &mut changed.client_quotas;
            for (entity, key, value) in changes {
                let values = client_quotas.entry(entity.clone()).or_default();
                match value {
                    Some(value) => values.insert(key, value),
                    None => values.remove(&key),
                };
                if values.is_empty() {
                    client_quotas.remove(&entity);
                }
            }
            store_local(path, &mut current, changed)?;
            quotas.set_configured(&current.client_quotas);
            return Ok(());
        }
        // Applying the metadata (in the broker) sets `quotas.configured`.
        cluster.write_client_quotas(changes).await
    }

    /// Adds and removes validated ACLs, durably, as one change.
    pub async fn alter_acls(
        &self,
        cluster: &impl SecurityController,
        create: Vec<AclBinding>,
        delete: Vec<AclBinding>,
    ) -> Result<(), Failure> {
        if let Some((path, local)) = &self.local {
            let mut current = local.lock();
            let mut changed = current.clone();
            for acl in &delete {
                changed.acls.remove(acl);
            }
            changed.acls.extend(create);
            if changed.acls.len() > sluice_cluster::metadata::ACLS_MAX {
                let text = format!("more than {} ACLs", sluice_cluster::metadata::ACLS_MAX);
                return Err((kafka_protocol::ResponseError::PolicyViolation, text));
            }
            return store_local(path, &mut current, changed);
        }
        cluster.write_acls(create, delete).await
    }
}
