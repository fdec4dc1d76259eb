//! The connection flags of the tools that speak the protocol themselves (`sluice acl`,
//! `sluice user`, `sluice share`): librdkafka has no API for what they do, and the
//! librdkafka built into `sluice` has no TLS, so they use `sluice-client`.
//!
//! `-b` and `-X key=value` (librdkafka's property names) reach the same listener from every
//! tool; a SASL password not given with `-X sasl.password` is read from
//! [`SASL_PASSWORD_ENV`], else prompted for on a terminal.

use std::io::IsTerminal;

use anyhow::bail;
pub use sluice_client::Connector;
use sluice_client::Settings;

/// Where the password of `sasl.username` is read when `-X sasl.password` is not given.
pub const SASL_PASSWORD_ENV: &str = "SLUICE_SASL_PASSWORD";
/// The `client.id` of the tools' requests.
const CLIENT_ID: &str = "sluice-cli";

/// `-b` and `-X`, shared by `sluice acl`, `sluice user` and `sluice share`; both may be
/// given before or after the subcommand.
#[derive(Debug, clap::Args)]
pub struct ConnectionArgs {
    /// Broker to bootstrap from: any listener, reached as -X security.protocol says.
    #[arg(long, short = 'b', env = "SLUICE_BOOTSTRAP", default_value = "127.0.0.1:9092", global = true)]
    bootstrap: String,
    /// Connection settings, repeatable, librdkafka names: -X security.protocol=SASL_SSL
    /// -X sasl.mechanism=SCRAM-SHA-512 -X sasl.username=admin -X ssl.ca.location=ca.pem
    /// (sasl.password defaults to $SLUICE_SASL_PASSWORD, else a prompt).
    #[arg(short = 'X', value_name = "KEY=VALUE", global = true)]
    settings: Vec<String>,
}

impl ConnectionArgs {
    /// The first bootstrap address (the tools ask one broker; it names the others).
    pub fn bootstrap(&self) -> &str {
        self.bootstrap.split(',').next().unwrap_or(&self.bootstrap).trim()
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
}
