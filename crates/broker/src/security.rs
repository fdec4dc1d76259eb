//! The broker's side of `sluice-security`: what it asks of the broker (the ACLs and SCRAM
//! credentials in force, the cluster metadata, writes through the controller), and the
//! checks handlers make of a client's session.

use std::collections::BTreeSet;
use std::sync::Arc;

use sluice_cluster::{AclBinding, ClusterMetadata, QuotaEntity, ScramCredential};
use sluice_security::acl::{CLUSTER_RESOURCE_NAME, OP_CLUSTER_ACTION, RESOURCE_CLUSTER};
use sluice_security::{
    AclSource, ClientQuotas, OauthValidator, SaslMechanism, SaslServer, SecurityController, Upsertion, UserCredentials,
    INTER_BROKER_USER,
};

use crate::handlers::{ClientSession, Failure};
use crate::Broker;

impl Broker {
    /// Whether the client of `session` may do `operation` on the resource.
    pub(crate) fn authorized(&self, session: &ClientSession, operation: i8, resource_type: i8, name: &str) -> bool {
        let Some(authorizer) = &self.authorizer else { return true };
        authorizer.allows(self, &session.principal, session.peer.ip(), operation, resource_type, name)
    }

    /// Whether some ACL lets the client write some topic (what an idempotent producer
    /// needs instead of IDEMPOTENT_WRITE on the cluster, since Kafka 3.0).
    pub(crate) fn may_write_some_topic(&self, session: &ClientSession) -> bool {
        let Some(authorizer) = &self.authorizer else { return true };
        authorizer.may_write_some_topic(self, &session.principal, session.peer.ip())
    }

    pub(crate) fn authorized_on_cluster(&self, session: &ClientSession, operation: i8) -> bool {
        self.authorized(session, operation, RESOURCE_CLUSTER, CLUSTER_RESOURCE_NAME)
    }

    /// Whether the client may act as a broker (fetch as a replica, read and write share-group
    /// state): CLUSTER_ACTION on the cluster, from an ACL or `super.users`, as in Kafka. The
    /// brokers' own user is a super user, and only a connection that proved the cluster's
    /// secret is that user; which listener a connection came in on grants nothing, so a
    /// PLAINTEXT inter-broker listener under an authorizer needs its (anonymous) principal
    /// in `super.users`, as Kafka's does.
    pub(crate) fn may_replicate(&self, session: &ClientSession) -> bool {
        self.authorized_on_cluster(session, OP_CLUSTER_ACTION)
    }

    /// A user's credential for one SCRAM mechanism, as this node knows it now.
    pub(crate) fn scram_credential(&self, user: &str, mechanism: &str) -> Option<ScramCredential> {
        if user == INTER_BROKER_USER {
            return self.inter_broker.credential(mechanism);
        }
        self.with_scram_credentials(|all| all.get(user).and_then(|m| m.get(mechanism)).cloned())
    }

    pub(crate) fn with_scram_credentials<T>(&self, read: impl FnOnce(&UserCredentials) -> T) -> T {
        self.security.with_scram_credentials(self, read)
    }

    pub(crate) fn with_acls<T>(&self, read: impl FnOnce(&BTreeSet<AclBinding>) -> T) -> T {
        self.security.with_acls(self, read)
    }

    pub(crate) fn with_client_quotas<T>(&self, read: impl FnOnce(&ClientQuotas) -> T) -> T {
        self.security.with_client_quotas(self, read)
    }

    /// Applies validated credential changes: on a single node persisted before returning,
    /// in a cluster committed by the controller and applied here.
    pub(crate) async fn alter_scram_credentials(
        &self,
        upsertions: Vec<Upsertion>,
        deletions: Vec<(String, String)>,
    ) -> Result<(), Failure> {
        self.security.alter_scram_credentials(self, upsertions, deletions).await
    }

    /// Sets (`Some`) or removes (`None`) validated quota values, durably, as one change.
    pub(crate) async fn alter_client_quotas(
        &self,
        changes: Vec<(QuotaEntity, String, Option<u64>)>,
    ) -> Result<(), Failure> {
        self.security.alter_client_quotas(self, &self.quotas, changes).await
    }

    /// Adds and removes validated ACLs, durably, as one change.
    pub(crate) async fn alter_acls(&self, create: Vec<AclBinding>, delete: Vec<AclBinding>) -> Result<(), Failure> {
        self.security.alter_acls(self, create, delete).await
    }
}

impl AclSource for Broker {
    fn with_acls<T>(&self, read: impl FnOnce(&BTreeSet<AclBinding>) -> T) -> T {
        Broker::with_acls(self, read)
    }
}

impl SaslServer for Broker {
    fn enabled_mechanisms(&self) -> Vec<SaslMechanism> {
        sluice_security::sasl_mechanisms(&self.config.sasl_enabled_mechanisms).expect("validated at startup")
    }

    fn max_reauth_ms(&self) -> u64 {
        self.config.connections_max_reauth_ms
    }

    fn scram_credential(&self, user: &str, mechanism: &str) -> Option<ScramCredential> {
        Broker::scram_credential(self, user, mechanism)
    }

    fn oauth(&self) -> Option<&OauthValidator> {
        self.oauth.as_ref()
    }
}

impl SecurityController for Broker {
    fn applied_metadata(&self) -> Option<Arc<ClusterMetadata>> {
        self.cluster.as_ref().map(|cluster| cluster.metadata())
    }

    async fn write_scram_credentials(
        &self,
        upsertions: Vec<Upsertion>,
        deletions: Vec<(String, String)>,
    ) -> Result<(), Failure> {
        let controller = crate::metadata_writes::controller(self)?;
        crate::metadata_writes::controller_write(self, controller.alter_scram_credentials(upsertions, deletions)).await
    }

    async fn write_client_quotas(&self, changes: Vec<(QuotaEntity, String, Option<u64>)>) -> Result<(), Failure> {
        let controller = crate::metadata_writes::controller(self)?;
        // Applying the metadata here (cluster_link) sets `quotas.configured`.
        crate::metadata_writes::controller_write(self, controller.alter_client_quotas(changes)).await
    }

    async fn write_acls(&self, create: Vec<AclBinding>, delete: Vec<AclBinding>) -> Result<(), Failure> {
        let controller = crate::metadata_writes::controller(self)?;
        crate::metadata_writes::controller_write(self, controller.alter_acls(create, delete)).await
    }
}
