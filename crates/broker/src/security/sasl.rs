//! SASL authentication of one connection (KIP-43, KIP-152): SaslHandshake picks the
//! mechanism, then SaslAuthenticate carries its tokens, PLAIN, SCRAM-SHA-256/512 or
//! OAUTHBEARER (security/oauth.rs).
//!
//! On a SASL listener nothing but ApiVersions, SaslHandshake and SaslAuthenticate is
//! served before authentication succeeds; a failure is answered with Kafka's error and
//! the connection is closed after that answer, as Kafka does. PLAIN passwords are checked
//! against the user's stored SCRAM credential, so no listener needs plaintext passwords.
//! On SASL_SSL the SASL user is the principal, as in Kafka, whatever certificate was shown.

use bytes::Bytes;
use kafka_protocol::messages::{
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::scram::{Mechanism as ScramMechanism, ScramError, ScramExchange};
use crate::Broker;

/// The principal of connections that did not authenticate (PLAINTEXT and SSL listeners).
pub const ANONYMOUS: &str = "ANONYMOUS";
/// Longest PLAIN message accepted.
const PLAIN_MESSAGE_BYTES_MAX: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mechanism {
    Plain,
    Scram(ScramMechanism),
    OauthBearer,
}

impl Mechanism {
    pub(crate) fn from_name(name: &str) -> Option<Mechanism> {
        match name {
            "PLAIN" => Some(Mechanism::Plain),
            "OAUTHBEARER" => Some(Mechanism::OauthBearer),
            other => ScramMechanism::from_name(other).map(Mechanism::Scram),
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::OauthBearer => "OAUTHBEARER",
            Mechanism::Scram(scram) => scram.name(),
        }
    }
}

enum State {
    /// Waiting for SaslHandshake.
    Handshake,
    /// Mechanism chosen; waiting for the first SaslAuthenticate.
    Authenticate(Mechanism),
    /// SCRAM: server-first sent; waiting for client-final.
    ScramFinal(Box<ScramExchange>),
    /// Authenticated as this user (or a listener without SASL: [`ANONYMOUS`]).
    Done(String),
    /// Failed: the connection closes once the answer is written.
    Failed,
}

/// What the connection does after answering a SASL request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next {
    Continue,
    Close,
}

pub(crate) struct Authenticator {
    sasl: bool,
    state: State,
}

impl Authenticator {
    /// `sasl`: whether the listener requires SASL authentication. Without SASL the user is
    /// the client certificate's subject (mutual TLS), else [`ANONYMOUS`].
    pub(crate) fn new(sasl: bool, certificate_user: Option<String>) -> Authenticator {
        let state = if sasl {
            State::Handshake
        } else {
            State::Done(certificate_user.unwrap_or_else(|| ANONYMOUS.to_string()))
        };
        Authenticator { sasl, state }
    }

    /// The authenticated user name, once authenticated.
    pub(crate) fn user(&self) -> Option<&str> {
        match &self.state {
            State::Done(user) => Some(user),
            _ => None,
        }
    }

    pub(crate) fn handshake(
        &mut self,
        broker: &Broker,
        request: SaslHandshakeRequest,
    ) -> (SaslHandshakeResponse, Next) {
        let mut response = SaslHandshakeResponse::default();
        let enabled = broker.sasl_mechanisms();
        response.mechanisms = enabled.iter().map(|m| StrBytes::from_static_str(m.name())).collect();
        if !self.sasl || !matches!(self.state, State::Handshake) {
            response.error_code = ResponseError::IllegalSaslState.code();
            return (response, if self.sasl { self.fail() } else { Next::Continue });
        }
        match Mechanism::from_name(request.mechanism.as_str()).filter(|m| enabled.contains(m)) {
            Some(mechanism) => {
                self.state = State::Authenticate(mechanism);
                (response, Next::Continue)
            }
            None => {
                tracing::info!(mechanism = %request.mechanism, "SASL handshake with a mechanism not enabled");
                response.error_code = ResponseError::UnsupportedSaslMechanism.code();
                (response, self.fail())
            }
        }
    }

    pub(crate) fn authenticate(
        &mut self,
        broker: &Broker,
        request: SaslAuthenticateRequest,
    ) -> (SaslAuthenticateResponse, Next) {
        let mut response = SaslAuthenticateResponse::default();
        let state = std::mem::replace(&mut self.state, State::Failed);
        let outcome = match state {
            State::Authenticate(Mechanism::Plain) => {
                plain(broker, &request.auth_bytes).map(|user| (State::Done(user), Bytes::new()))
            }
            State::Authenticate(Mechanism::OauthBearer) => match &broker.oauth {
                Some(validator) => {
                    validator.authenticate(&request.auth_bytes).map(|user| (State::Done(user), Bytes::new()))
                }
                None => Err("Authentication failed: OAUTHBEARER is not configured".to_string()),
            },
            State::Authenticate(Mechanism::Scram(mechanism)) => {
                ScramExchange::start(mechanism, &request.auth_bytes, |user| {
                    broker.scram_credential(user, mechanism.name())
                })
                .map(|(exchange, server_first)| (State::ScramFinal(Box::new(exchange)), Bytes::from(server_first)))
                .map_err(|error| scram_failure(mechanism, error))
            }
            State::ScramFinal(exchange) => {
                let mechanism = exchange.mechanism();
                exchange
                    .finish(&request.auth_bytes)
                    .map(|(user, server_final)| (State::Done(user), Bytes::from(server_final)))
                    .map_err(|error| scram_failure(mechanism, error))
            }
            other => {
                self.state = other;
                response.error_code = ResponseError::IllegalSaslState.code();
                response.error_message = Some(StrBytes::from_static_str("SaslAuthenticate is not expected now"));
                return (response, if self.sasl { self.fail() } else { Next::Continue });
            }
        };
        match outcome {
            Ok((state, bytes)) => {
                if let State::Done(user) = &state {
                    tracing::debug!(%user, "SASL authentication succeeded");
                }
                self.state = state;
                response.auth_bytes = bytes;
                (response, Next::Continue)
            }
            Err(message) => {
                tracing::info!(%message, "SASL authentication failed");
                response.error_code = ResponseError::SaslAuthenticationFailed.code();
                response.error_message = Some(StrBytes::from_string(message));
                (response, self.fail())
            }
        }
    }

    fn fail(&mut self) -> Next {
        self.state = State::Failed;
        Next::Close
    }
}

fn scram_failure(mechanism: ScramMechanism, error: ScramError) -> String {
    match error {
        ScramError::InvalidCredentials => format!(
            "Authentication failed during authentication due to invalid credentials with SASL mechanism {}",
            mechanism.name()
        ),
        ScramError::Malformed(what) => format!("Authentication failed: invalid SCRAM message ({what})"),
    }
}

/// SASL/PLAIN (RFC 4616): `authzid NUL authcid NUL passwd`, checked against the user's
/// SCRAM credential (SHA-512 first, then SHA-256).
fn plain(broker: &Broker, message: &[u8]) -> Result<String, String> {
    let invalid = || "Authentication failed: Invalid username or password".to_string();
    if message.len() > PLAIN_MESSAGE_BYTES_MAX {
        return Err("Authentication failed: PLAIN message too long".into());
    }
    let text = std::str::from_utf8(message).map_err(|_| invalid())?;
    let mut parts = text.split('\0');
    let (Some(authzid), Some(user), Some(password), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("Authentication failed: Invalid SASL/PLAIN response: expected 3 tokens".into());
    };
    if user.is_empty() {
        return Err("Authentication failed: username not specified".into());
    }
    if !authzid.is_empty() && authzid != user {
        return Err(
            "Authentication failed: Client requested an authorization id that is different from username".into()
        );
    }
    let matches = [ScramMechanism::Sha512, ScramMechanism::Sha256].into_iter().any(|mechanism| {
        broker
            .scram_credential(user, mechanism.name())
            .is_some_and(|credential| mechanism.password_matches(&credential, password.as_bytes()))
    });
    if matches {
        Ok(user.to_string())
    } else {
        Err(invalid())
    }
}
