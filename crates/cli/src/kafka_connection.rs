//! The connection flags of every tool, and the Kafka-protocol client most of them use
//! (`sluice-client`): it says what the broker said (a response's `error_message`), it
//! never asks for a topic to be created, and a broker that cannot be reached is named at
//! once. Only `consume` goes through librdkafka (its fetch loop), after the same checks.
//!
//! `-b` and `-X key=value` (librdkafka's property names) are global: given before or after
//! the subcommand, they reach the same listener from every tool. A SASL password not given
//! with `-X sasl.password` is read from [`SASL_PASSWORD_ENV`], else prompted for on a
//! terminal.

use std::collections::BTreeMap;
use std::io::IsTerminal;

use anyhow::bail;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::metadata_response::MetadataResponseTopic;
use kafka_protocol::messages::{MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
pub use sluice_client::Connector;
use sluice_client::{KafkaConnection, Settings};

/// Where the password of `sasl.username` is read when `-X sasl.password` is not given.
pub const SASL_PASSWORD_ENV: &str = "SLUICE_SASL_PASSWORD";
/// The `client.id` of the tools' requests.
const CLIENT_ID: &str = "sluice-cli";
/// Metadata v12: topic ids, and `allow_auto_topic_creation` is honoured.
const METADATA_VERSION: i16 = 12;
/// Error code of a topic the cluster does not have.
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;

/// `-b` and `-X`, shared by every subcommand; both may be given before or after it.
#[derive(Debug, clap::Args)]
pub struct ConnectionArgs {
    /// Broker(s) to bootstrap from (host:port[,host:port]): any listener, reached as
    /// -X security.protocol says.
    #[arg(
        long = "brokers",
        visible_alias = "bootstrap",
        short = 'b',
        env = "SLUICE_BOOTSTRAP",
        default_value = "127.0.0.1:9092",
        global = true,
        value_name = "HOST:PORT"
    )]
    bootstrap: String,
    /// Connection settings, repeatable, librdkafka names: -X security.protocol=SASL_SSL
    /// -X sasl.mechanism=SCRAM-SHA-512 -X sasl.username=admin -X ssl.ca.location=ca.pem
    /// -X socket.connection.setup.timeout.ms=5000 (sasl.password defaults to
    /// $SLUICE_SASL_PASSWORD, else a prompt).
    #[arg(short = 'X', value_name = "KEY=VALUE", global = true)]
    settings: Vec<String>,
}

impl ConnectionArgs {
    /// The first bootstrap address (the tools ask one broker; it names the others).
    pub fn bootstrap(&self) -> &str {
        self.bootstrap.split(',').next().unwrap_or(&self.bootstrap).trim()
    }

    /// The bootstrap list as given, for librdkafka.
    pub fn bootstrap_list(&self) -> &str {
        &self.bootstrap
    }

    /// The `-X` pairs as given, for librdkafka.
    pub fn raw_settings(&self) -> &[String] {
        &self.settings
    }

    /// Reads the settings, the TLS files and the SASL password: every mistake in them is
    /// reported before any connection is made.
    pub fn connector(&self) -> anyhow::Result<Connector> {
        let mut settings = Settings::parse(&self.settings)?;
        if let Some(username) = settings.missing_password().map(str::to_string) {
            let password = match std::env::var(SASL_PASSWORD_ENV) {
                Ok(password) if !password.is_empty() => password,
                _ if std::io::stdin().is_terminal() => rpassword::prompt_password(format!("Password of {username}: "))?,
                _ => bail!("no password for sasl.username {username}: set {SASL_PASSWORD_ENV} or -X sasl.password"),
            };
            settings.set("sasl.password", &password)?;
        }
        Ok(Connector::new(&settings)?.with_client_id(CLIENT_ID))
    }

    /// A connection to the cluster: the first bootstrap broker that answers.
    pub fn cluster(&self) -> anyhow::Result<Cluster> {
        let connector = self.connector()?;
        let mut first_error = None;
        for address in self.bootstrap.split(',').map(str::trim).filter(|a| !a.is_empty()) {
            match connector.connect(address) {
                Ok(bootstrap) => return Ok(Cluster { connector, bootstrap }),
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        Err(first_error.unwrap_or_else(|| anyhow::anyhow!("-b names no broker")))
    }
}

/// A connection to one broker of the cluster, and the means to open others (a partition's
/// leader, a group's coordinator).
pub struct Cluster {
    pub connector: Connector,
    pub bootstrap: KafkaConnection,
}

impl Cluster {
    /// Metadata of `topics` (`None`: every topic; empty: only the brokers). Never creates a
    /// topic: read-only commands must leave the cluster as they found it.
    pub fn metadata(&mut self, topics: Option<&[&str]>) -> anyhow::Result<MetadataResponse> {
        let mut request = MetadataRequest::default();
        request.allow_auto_topic_creation = false;
        request.topics = topics.map(|names| {
            names
                .iter()
                .map(|name| {
                    MetadataRequestTopic::default().with_name(Some(TopicName(StrBytes::from_string(name.to_string()))))
                })
                .collect()
        });
        self.bootstrap.send(METADATA_VERSION, request)
    }

    /// The metadata of one topic, or "topic NAME does not exist".
    pub fn topic(&mut self, name: &str) -> anyhow::Result<(MetadataResponse, MetadataResponseTopic)> {
        let mut metadata = self.metadata(Some(&[name]))?;
        let found = metadata.topics.iter().position(|t| t.name.as_ref().is_some_and(|n| n.as_str() == name));
        let Some(index) = found else { bail!("topic {name} does not exist") };
        let topic = metadata.topics.remove(index);
        if topic.error_code == UNKNOWN_TOPIC_OR_PARTITION {
            bail!("topic {name} does not exist");
        }
        sluice_client::check(topic.error_code, None, &format!("topic {name}"))?;
        Ok((metadata, topic))
    }

    /// host:port of each broker of `metadata`, by node id.
    pub fn addresses(metadata: &MetadataResponse) -> BTreeMap<i32, String> {
        metadata.brokers.iter().map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port))).collect()
    }

    /// A new connection to `address` (a partition's leader), with the same settings.
    pub fn connect(&self, address: &str) -> anyhow::Result<KafkaConnection> {
        self.connector.connect(address)
    }
}
