//! The settings security reads, under Kafka's names: the broker fills them in from its own
//! configuration, so this crate depends on no configuration format.

use std::path::PathBuf;

use crate::listeners::Listener;

/// Everything the security checks at startup read.
#[derive(Debug, Clone)]
pub struct SecuritySettings {
    /// The parsed listeners, in configured order.
    pub listeners: Vec<Listener>,
    /// Index in `listeners` of the one other nodes connect to.
    pub inter_broker_listener: usize,
    /// `sasl.enabled.mechanisms`.
    pub sasl_enabled_mechanisms: String,
    /// `sasl.mechanism.inter.broker.protocol`.
    pub sasl_mechanism_inter_broker_protocol: Option<String>,
    /// `authorizer.class.name`.
    pub authorizer_class_name: Option<String>,
    /// `super.users`: principals separated by semicolons.
    pub super_users: String,
    /// `allow.everyone.if.no.acl.found`.
    pub allow_everyone_if_no_acl_found: bool,
    pub tls: TlsSettings,
    pub oauth: OauthSettings,
    /// `Some` when the node is part of a replicated cluster.
    pub cluster: Option<ClusterSecuritySettings>,
}

/// The `ssl.*` settings.
#[derive(Debug, Clone)]
pub struct TlsSettings {
    pub keystore_type: String,
    pub keystore_location: Option<PathBuf>,
    pub keystore_certificate_chain: Option<String>,
    pub keystore_key: Option<String>,
    pub key_password: Option<String>,
    pub truststore_type: String,
    pub truststore_location: Option<PathBuf>,
    pub truststore_certificates: Option<String>,
    /// `ssl.client.auth`: none, requested or required.
    pub client_auth: String,
}

/// The `sasl.oauthbearer.*` settings.
#[derive(Debug, Clone)]
pub struct OauthSettings {
    pub jwks_endpoint_url: Option<String>,
    /// Comma-separated audiences; empty: the audience is not checked.
    pub expected_audience: String,
    pub expected_issuer: Option<String>,
    pub sub_claim_name: String,
    pub clock_skew_seconds: u64,
}

/// The security settings of a node in a replicated cluster.
#[derive(Debug, Clone)]
pub struct ClusterSecuritySettings {
    /// The file of the secret every node shares (see [`crate::read_rpc_secret`]).
    pub rpc_secret_file: Option<PathBuf>,
    /// Whether controller RPC runs over TLS.
    pub rpc_tls: bool,
}
