//! SASL authentication of one connection (KIP-43, KIP-152): SaslHandshake picks the
//! mechanism, then SaslAuthenticate carries its tokens, PLAIN, SCRAM-SHA-256/512 or
//! OAUTHBEARER (oauth.rs).
//!
//! On a SASL listener nothing but ApiVersions, SaslHandshake and SaslAuthenticate is
//! served before authentication succeeds; a failure is answered with Kafka's error and
//! the connection is closed after that answer, as Kafka does. PLAIN passwords are checked
//! against the user's stored SCRAM credential, so no listener needs plaintext passwords.
//! On SASL_SSL the SASL user is the principal, as in Kafka, whatever certificate was shown.
//!
//! Whether a user exists is not told, by answers or by timing: an unknown user's PLAIN
//! password is derived against a stand-in credential with the iterations a credential is
//! given by default, and SCRAM answers an unknown user with a server-first message whose
//! salt is stable for that name, failing only at the proof (RFC 5802, section 5.1). Each
//! SaslAuthenticate step runs on the blocking pool (the broker lets a few run at once):
//! PBKDF2 takes milliseconds of CPU an I/O thread must not spend.
//!
//! Re-authentication (KIP-368): with `connections.max.reauth.ms` set, a successful
//! SaslAuthenticate tells the client how long its session lasts (no longer than an
//! OAUTHBEARER token); the client authenticates again on the same connection before then,
//! as the same principal, and a connection whose session ended is closed at its next request.

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::{
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use sluice_cluster::ScramCredential;

use crate::oauth::OauthValidator;
use crate::scram::{Mechanism as ScramMechanism, ScramError, ScramExchange};

/// The principal of connections that did not authenticate (PLAINTEXT and SSL listeners).
pub const ANONYMOUS: &str = "ANONYMOUS";
/// Longest PLAIN message accepted.
const PLAIN_MESSAGE_BYTES_MAX: usize = 1024;

/// What a SASL exchange needs from the broker that serves it.
pub trait SaslServer {
    /// The mechanisms `sasl.enabled.mechanisms` offers.
    fn enabled_mechanisms(&self) -> Vec<Mechanism>;
    /// `connections.max.reauth.ms` (0: sessions never end).
    fn max_reauth_ms(&self) -> u64;
    /// A user's credential for one SCRAM mechanism, as the broker knows it now.
    fn scram_credential(&self, user: &str, mechanism: &str) -> Option<ScramCredential>;
    /// The OAUTHBEARER token validator, when a listener offers OAUTHBEARER.
    fn oauth(&self) -> Option<&OauthValidator>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    Plain,
    Scram(ScramMechanism),
    OauthBearer,
}

impl Mechanism {
    pub fn from_name(name: &str) -> Option<Mechanism> {
        match name {
            "PLAIN" => Some(Mechanism::Plain),
            "OAUTHBEARER" => Some(Mechanism::OauthBearer),
            other => ScramMechanism::from_name(other).map(Mechanism::Scram),
        }
    }

    pub fn name(self) -> &'static str {
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
pub enum Next {
    Continue,
    Close,
}

pub struct Authenticator {
    sasl: bool,
    state: State,
    /// The user of the session being re-authenticated (KIP-368): it may not change.
    reauthenticating: Option<String>,
    /// When the current session ends, if it does.
    session_expires: Option<std::time::Instant>,
}

impl Authenticator {
    /// `sasl`: whether the listener requires SASL authentication. Without SASL the user is
    /// the client certificate's subject (mutual TLS), else [`ANONYMOUS`].
    pub fn new(sasl: bool, certificate_user: Option<String>) -> Authenticator {
        let state = if sasl {
            State::Handshake
        } else {
            State::Done(certificate_user.unwrap_or_else(|| ANONYMOUS.to_string()))
        };
        Authenticator { sasl, state, reauthenticating: None, session_expires: None }
    }

    /// Whether the session ended without re-authentication (the connection must close).
    pub fn session_expired(&self) -> bool {
        self.session_expires.is_some_and(|at| std::time::Instant::now() >= at)
    }

    /// The authenticated user name, once authenticated.
    pub fn user(&self) -> Option<&str> {
        match &self.state {
            State::Done(user) => Some(user),
            _ => None,
        }
    }

    pub fn handshake(
        &mut self,
        broker: &impl SaslServer,
        request: SaslHandshakeRequest,
    ) -> (SaslHandshakeResponse, Next) {
        let mut response = SaslHandshakeResponse::default();
        let enabled = broker.enabled_mechanisms();
        response.mechanisms = enabled.iter().map(|m| StrBytes::from_static_str(m.name())).collect();
        if let State::Done(user) = &self.state {
            if self.sasl && broker.max_reauth_ms() > 0 {
                self.reauthenticating = Some(user.clone());
                self.state = State::Handshake;
            }
        }
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

    /// [`Authenticator::authenticate`] on the blocking pool.
    pub async fn authenticate_off_io_thread<S: SaslServer + Send + Sync + 'static>(
        &mut self,
        broker: &Arc<S>,
        request: SaslAuthenticateRequest,
    ) -> (SaslAuthenticateResponse, Next) {
        let placeholder = Authenticator::new(self.sasl, None);
        let mut authenticator = std::mem::replace(self, placeholder);
        let broker = broker.clone();
        let (authenticator, answer) = tokio::task::spawn_blocking(move || {
            let answer = authenticator.authenticate(&*broker, request);
            (authenticator, answer)
        })
        .await
        .expect("a SASL step does not panic (a panic stops the broker)");
        *self = authenticator;
        answer
    }

    pub fn authenticate(
        &mut self,
        broker: &impl SaslServer,
        request: SaslAuthenticateRequest,
    ) -> (SaslAuthenticateResponse, Next) {
        let mut response = SaslAuthenticateResponse::default();
        let state = std::mem::replace(&mut self.state, State::Failed);
        // OAUTHBEARER: the token's expiry (seconds since the epoch) bounds the session.
        let mut token_expiry: Option<u64> = None;
        let outcome = match state {
            State::Authenticate(Mechanism::Plain) => {
                plain(broker, &request.auth_bytes).map(|user| (State::Done(user), Bytes::new()))
            }
            State::Authenticate(Mechanism::OauthBearer) => match broker.oauth() {
                Some(validator) => validator.authenticate(&request.auth_bytes).map(|(user, expiry)| {
                    token_expiry = Some(expiry);
                    (State::Done(user), Bytes::new())
                }),
                None => Err("Authentication failed: OAUTHBEARER is not configured".to_string()),
            },
            State::Authenticate(Mechanism::Scram(mechanism)) => {
                ScramExchange::start(mechanism, &request.auth_bytes, |user| {
                    let credential = broker.scram_credential(user, mechanism.name());
                    Some(credential.unwrap_or_else(|| mechanism.stand_in_credential(user)))
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
        let outcome = outcome.and_then(|(state, bytes)| match (&state, self.reauthenticating.take()) {
            (State::Done(user), Some(previous)) if *user != previous => {
                Err(format!("Cannot change principals during re-authentication from User:{previous}: User:{user}"))
            }
            _ => Ok((state, bytes)),
        });
        match outcome {
            Ok((state, bytes)) => {
                if let State::Done(user) = &state {
                    tracing::debug!(%user, "SASL authentication succeeded");
                    let lifetime_ms = session_lifetime_ms(broker.max_reauth_ms(), token_expiry);
                    if lifetime_ms > 0 {
                        response.session_lifetime_ms = lifetime_ms as i64;
                        let lifetime = std::time::Duration::from_millis(lifetime_ms);
                        self.session_expires = Some(std::time::Instant::now() + lifetime);
                    }
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

/// How long a new session lasts: `connections.max.reauth.ms`, no longer than the token's
/// remaining life; 0 (re-authentication off) means it never ends, as in Kafka.
fn session_lifetime_ms(reauth_ms: u64, token_expiry_s: Option<u64>) -> u64 {
    if reauth_ms == 0 {
        return 0;
    }
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    // An already expired token still gets a moment to re-authenticate (never 0: "forever").
    let token_ms = token_expiry_s.map(|expiry| expiry.saturating_mul(1000).saturating_sub(now_ms).max(1));
    token_ms.map_or(reauth_ms, |token_ms| token_ms.min(reauth_ms))
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
fn plain(broker: &impl SaslServer, message: &[u8]) -> Result<String, String> {
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
    if password_matches(broker, user, password) {
        Ok(user.to_string())
    } else {
        Err(invalid())
    }
}

/// Whether `password` is `user`'s, checked against the user's SCRAM credentials (SHA-512
/// first, then SHA-256): what SASL/PLAIN and the HTTP APIs' basic authentication check.
pub fn password_matches(broker: &impl SaslServer, user: &str, password: &str) -> bool {
    // Every mechanism is tried, with a stand-in for a credential the user lacks: the same
    // work whether the user exists, has one credential or two, or the first one matched.
    let matches = [ScramMechanism::Sha512, ScramMechanism::Sha256].map(|mechanism| {
        match broker.scram_credential(user, mechanism.name()) {
            Some(credential) => mechanism.password_matches(&credential, password.as_bytes()),
            None => {
                let stand_in = mechanism.stand_in_credential(user);
                let never = mechanism.password_matches(&stand_in, password.as_bytes());
                assert!(!never, "a stand-in credential matches no password");
                false
            }
        }
    });
    matches.contains(&true)
}
