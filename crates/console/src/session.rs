//! Who is using the console. On a broker whose clients log in (a SASL listener), a user logs
//! in with the same name and password as a Kafka client; the console then talks to the
//! cluster as that user (see `cluster`), over connections authenticated with those
//! credentials, until the session ends. Without SASL every visitor shares one anonymous
//! client, as every Kafka client is anonymous there.
//!
//! A session is a random 256-bit token in an `HttpOnly`, `SameSite=Strict` cookie; it ends
//! at logout or after [`SESSION_IDLE`] without a request. At most [`SESSIONS_MAX`] are kept
//! (the least recently used is ended first).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::http::HeaderMap;
use parking_lot::Mutex;
use sluice_client::{Connector, SaslMechanism, Settings};

use crate::cluster::ClusterClient;

/// The cookie that carries the session token.
pub const COOKIE: &str = "sluice_console";
/// How long a session lasts without a request.
pub const SESSION_IDLE: Duration = Duration::from_secs(8 * 3600);
/// Sessions kept at once.
pub const SESSIONS_MAX: usize = 1024;
/// The longest user name or password accepted at login.
pub const CREDENTIAL_BYTES_MAX: usize = 1024;
/// The `client.id` of the console's requests.
const CLIENT_ID: &str = "sluice-console";
/// The `client.id` of the history sampler's requests.
const HISTORY_CLIENT_ID: &str = "sluice-console-history";

/// How visitors reach the cluster.
#[derive(Clone)]
pub enum Login {
    /// No credentials: every visitor is the listener's anonymous client.
    Anonymous,
    /// A SASL user and password, tried with these mechanisms in order.
    Sasl(Vec<SaslMechanism>),
}

/// One visitor's session.
pub struct Session {
    /// The SASL user, when logged in.
    pub user: Option<String>,
    pub cluster: Arc<ClusterClient>,
    last_used: Mutex<Instant>,
}

/// The sessions of one console.
pub struct Sessions {
    bootstrap: String,
    settings: Settings,
    login: Login,
    open: Mutex<HashMap<String, Arc<Session>>>,
    /// The shared client when there is no login.
    anonymous: tokio::sync::OnceCell<Arc<Session>>,
}

impl Sessions {
    pub fn new(bootstrap: String, settings: Settings, login: Login) -> Sessions {
        Sessions { bootstrap, settings, login, open: Mutex::new(HashMap::new()), anonymous: Default::default() }
    }

    pub fn needs_login(&self) -> bool {
        matches!(self.login, Login::Sasl(_))
    }

    /// The session a request belongs to, if any.
    pub async fn find(&self, headers: &HeaderMap) -> anyhow::Result<Option<Arc<Session>>> {
        if !self.needs_login() {
            let session = self
                .anonymous
                .get_or_try_init(|| async {
                    let connector = Connector::new(&self.settings)?.with_client_id(CLIENT_ID);
                    let cluster = ClusterClient::open(connector, self.bootstrap.clone()).await?;
                    Ok::<_, anyhow::Error>(Arc::new(Session {
                        user: None,
                        cluster,
                        last_used: Mutex::new(Instant::now()),
                    }))
                })
                .await?;
            return Ok(Some(session.clone()));
        }
        let Some(token) = token_of(headers) else { return Ok(None) };
        let mut open = self.open.lock();
        open.retain(|_, session| session.last_used.lock().elapsed() < SESSION_IDLE);
        let session = open.get(token).cloned();
        if let Some(session) = &session {
            *session.last_used.lock() = Instant::now();
        }
        Ok(session)
    }

    /// Logs `user` in: a new session whose client authenticated to the cluster with
    /// `password`, and its token.
    pub async fn login(&self, user: &str, password: &str) -> anyhow::Result<String> {
        let Login::Sasl(mechanisms) = &self.login else { anyhow::bail!("this console has no login") };
        anyhow::ensure!(
            !user.is_empty() && user.len() <= CREDENTIAL_BYTES_MAX && password.len() <= CREDENTIAL_BYTES_MAX,
            "a user name and a password of at most {CREDENTIAL_BYTES_MAX} bytes"
        );
        let mut refused = None;
        for mechanism in mechanisms {
            let mut settings = self.settings.clone();
            settings.set("sasl.mechanism", mechanism.name())?;
            settings.set("sasl.username", user)?;
            settings.set("sasl.password", password)?;
            let connector = Connector::new(&settings)?.with_client_id(CLIENT_ID);
            match ClusterClient::open(connector, self.bootstrap.clone()).await {
                Ok(cluster) => return Ok(self.add(Session::new(Some(user.to_string()), cluster))),
                Err(error) => refused = Some(error),
            }
        }
        Err(refused.context("no SASL mechanism to log in with")?).context("login refused")
    }

    fn add(&self, session: Session) -> String {
        let token = new_token();
        let mut open = self.open.lock();
        if open.len() >= SESSIONS_MAX {
            let oldest = open.iter().min_by_key(|(_, s)| *s.last_used.lock()).map(|(t, _)| t.clone());
            oldest.map(|token| open.remove(&token));
        }
        assert!(open.len() < SESSIONS_MAX);
        open.insert(token.clone(), Arc::new(session));
        token
    }

    /// How the history sampler opens its client: anonymous without logins, else as
    /// `login` (user, password), with the first mechanism that takes it.
    pub fn history_client(&self, login: Option<(String, String)>) -> Option<crate::history::ClientOpener> {
        let (bootstrap, settings) = (self.bootstrap.clone(), self.settings.clone());
        let attempts: Vec<Settings> = match (&self.login, login) {
            (Login::Anonymous, _) => vec![settings],
            (Login::Sasl(_), None) => return None,
            (Login::Sasl(mechanisms), Some((user, password))) => mechanisms
                .iter()
                .filter_map(|mechanism| {
                    let mut settings = settings.clone();
                    settings.set("sasl.mechanism", mechanism.name()).ok()?;
                    settings.set("sasl.username", &user).ok()?;
                    settings.set("sasl.password", &password).ok()?;
                    Some(settings)
                })
                .collect(),
        };
        Some(Box::new(move || {
            let (bootstrap, attempts) = (bootstrap.clone(), attempts.clone());
            Box::pin(async move {
                let mut refused = None;
                for settings in attempts {
                    let connector = Connector::new(&settings)?.with_client_id(HISTORY_CLIENT_ID);
                    match ClusterClient::open(connector, bootstrap.clone()).await {
                        Ok(client) => return Ok(client),
                        Err(error) => refused = Some(error),
                    }
                }
                Err(refused.context("no SASL mechanism to sample with")?)
            })
        }))
    }

    /// Ends the session of `headers`, if any.
    pub fn logout(&self, headers: &HeaderMap) {
        if let Some(token) = token_of(headers) {
            self.open.lock().remove(token);
        }
    }
}

impl Session {
    fn new(user: Option<String>, cluster: Arc<ClusterClient>) -> Session {
        Session { user, cluster, last_used: Mutex::new(Instant::now()) }
    }
}

/// The session token of a request's cookies.
fn token_of(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, token)| token)
}

/// 32 random bytes, hex.
fn new_token() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The `Set-Cookie` value that starts a session (`Secure` over HTTPS).
pub fn cookie(token: &str, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!("{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict{secure}")
}

/// The `Set-Cookie` value that ends one.
pub fn cleared_cookie() -> String {
    format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_read_from_among_other_cookies() {
        let mut headers = HeaderMap::new();
        headers.insert("cookie", "theme=dark; sluice_console=abc123; x=y".parse().unwrap());
        assert_eq!(token_of(&headers), Some("abc123"));
        assert_eq!(token_of(&HeaderMap::new()), None);
        assert_eq!(new_token().len(), 64);
        assert_ne!(new_token(), new_token());
    }
}
